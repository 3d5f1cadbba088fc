package rewrite

import ("testing";"strings")

func mayHitSimple(s string) bool {
	if leadingHit(s, 0) { return true }
	for i := 0; i < len(s); i++ {
		if anchor[s[i]] != 0 && anchorHit(s, i) { return true }
	}
	return false
}
func BenchmarkMHUnrolled(b *testing.B) { for b.Loop() { MayHit(benchNoHit) } }
func BenchmarkMHSimple(b *testing.B) { for b.Loop() { mayHitSimple(benchNoHit) } }
func BenchmarkMHIndexAny(b *testing.B) { for b.Loop() { strings.IndexAny(benchNoHit, "\x00\x01") } }
func BenchmarkMHIndexByte(b *testing.B) { for b.Loop() { strings.IndexByte(benchNoHit, 0) } }
func TestAnchorCount(t *testing.T) { n:=0; blocks:=0; for i:=0;i<len(benchNoHit);i++ { if anchor[benchNoHit[i]]!=0 {n++} }; for i:=0;i+8<=len(benchNoHit);i+=8 { for j:=i;j<i+8;j++ { if anchor[benchNoHit[j]]!=0 {blocks++;break}}}; t.Log(len(benchNoHit), n, blocks) }
