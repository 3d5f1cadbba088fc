package rewrite

// ViewRef is a reference to a catalog view in a FROM list that lockpool
// replaces with the client's own rows: src[Pos:End] is the view's name
// from its qualifier (if any). Aliased reports that an alias follows (AS,
// or a name that is no reserved word), so the replacement must not add
// one.
type ViewRef struct {
	Span
	Aliased bool
}

// catalogViews records the references to pg_prepared_statements and
// pg_stat_activity (unqualified or pg_catalog-qualified, any case) that
// stand where a FROM list names a relation: after FROM, JOIN or a comma.
func (a *analyzer) catalogViews(src string, st []token) {
	for i, t := range st {
		if !isIdentTok(t.kind) {
			continue
		}
		var list *[]ViewRef
		switch {
		case identIs(src, t, "pg_prepared_statements"):
			list = &a.f.PreparedViews
		case identIs(src, t, "pg_stat_activity"):
			list = &a.f.ActivityViews
		default:
			continue
		}
		if i+1 < len(st) && (isPunct(src, st[i+1], '(') || isPunct(src, st[i+1], '.')) {
			continue // a function of that name, or a schema
		}
		pos, before := t.pos, i-1
		if before >= 1 && isPunct(src, st[before], '.') {
			if !isIdentTok(st[before-1].kind) || !identIs(src, st[before-1], "pg_catalog") {
				continue // another schema's relation
			}
			pos, before = st[before-1].pos, before-2
		}
		if before < 0 || !(kw(src, st[before], "from") || kw(src, st[before], "join") || isPunct(src, st[before], ',')) {
			continue
		}
		ref := ViewRef{Span: Span{Pos: pos, End: t.end}}
		if i+1 < len(st) {
			n := st[i+1]
			switch {
			case kw(src, n, "as"):
				ref.Aliased = true
			case n.kind == tIdent:
				ref.Aliased = !reservedWords[lowerASCII(src[n.pos:n.end])]
			case isIdentTok(n.kind):
				ref.Aliased = true
			}
		}
		*list = append(*list, ref)
	}
}
