package config

import "reflect"

// RestartNeeded returns the keys a reload from old to cur cannot apply: the
// keys marked restart in the key table whose value differs, in table
// order. A change inside a section marked restart (tls, cluster), or its
// addition or removal, is named by the section; a list item's key (such as
// "applications[].budget_scope") is compared between the items with the
// same name, a missing item counting as the key's default.
func RestartNeeded(old, cur *Config) []string {
	var out []string
	for i := range keys {
		k := &keys[i]
		if !k.restart || k.kind == kindList {
			continue
		}
		if p := k.parent(); p != "" && keyAt(p).restart && keyAt(p).kind == kindSection {
			continue // reported under the section's name
		}
		changed := false
		switch {
		case k.kind == kindSection:
			changed = !reflect.DeepEqual(sectionOf(old, k.path), sectionOf(cur, k.path))
		case keyAt(k.parent()) != nil && keyAt(k.parent()).kind == kindList:
			changed = listValueChanged(k, old, cur)
		default:
			po, pc := sectionOf(old, k.parent()), sectionOf(cur, k.parent())
			changed = (po == nil) != (pc == nil) || po != nil && load(k.at(po)) != load(k.at(pc))
		}
		if changed {
			out = append(out, k.path)
		}
	}
	return out
}

// listValueChanged compares k, a key of list items, between the items of
// old and cur with the same name.
func listValueChanged(k *key, old, cur *Config) bool {
	vo, vc := listValues(k, old), listValues(k, cur)
	dflt := defaultValue(k)
	for name, v := range vo {
		if w, ok := vc[name]; !ok && v != dflt || ok && v != w {
			return true
		}
	}
	for name, w := range vc {
		if _, ok := vo[name]; !ok && w != dflt {
			return true
		}
	}
	return false
}

// listValues maps each item of k's list in c, by its name key, to k's value.
func listValues(k *key, c *Config) map[string]any {
	list := keyAt(k.parent())
	name := keyAt(list.path + "[].name")
	out := map[string]any{}
	for _, item := range listItems(c, list) {
		out[load(name.at(item)).(string)] = load(k.at(item))
	}
	return out
}

// defaultValue is k's default as its kind stores it.
func defaultValue(k *key) any {
	parent := keyAt(k.parent())
	fresh := parent.at(&Config{}) // a new section struct or list item
	dst := k.at(fresh)
	k.setDefault(dst)
	return load(dst)
}

// keyAt returns the declaration of the key at path, nil for "" (the top
// level) and unknown paths.
func keyAt(path string) *key {
	for i := range keys {
		if keys[i].path == path {
			return &keys[i]
		}
	}
	return nil
}

// sectionOf returns the struct c's section at path fills ("" is c itself),
// or nil when it is an optional section that is not configured. It never
// changes c.
func sectionOf(c *Config, path string) any {
	if path == "" {
		return c
	}
	k := keyAt(path)
	if k == nil || k.kind != kindSection {
		panic("config: " + path + " is not a section")
	}
	if !k.optional {
		return k.at(c)
	}
	// An optional section's at allocates it: find the *Config field of the
	// type it returns instead.
	want := reflect.TypeOf(k.at(&Config{}))
	v := reflect.ValueOf(c).Elem()
	for i := range v.NumField() {
		if f := v.Field(i); f.Type() == want {
			if f.IsNil() {
				return nil
			}
			return f.Interface()
		}
	}
	panic("config: no field holds section " + path)
}

// listItems returns pointers to the items of c's list k (users,
// applications), which k.at's appending must not touch.
func listItems(c *Config, k *key) []any {
	want := reflect.SliceOf(reflect.TypeOf(k.at(&Config{})).Elem())
	v := reflect.ValueOf(c).Elem()
	for i := range v.NumField() {
		if f := v.Field(i); f.Type() == want {
			out := make([]any, f.Len())
			for j := range out {
				out[j] = f.Index(j).Addr().Interface()
			}
			return out
		}
	}
	panic("config: no field holds list " + k.path)
}

// KeyInfo describes one configuration key for other packages.
type KeyInfo struct {
	Path    string // as the reference shows it: "server.port", "applications[].max_pinned"
	Restart bool   // a reload does not apply a new value (see [RestartNeeded])
	Section bool   // a section or a list, not a value
}

// Keys lists every declared key, in table order.
func Keys() []KeyInfo {
	out := make([]KeyInfo, len(keys))
	for i := range keys {
		out[i] = KeyInfo{Path: keys[i].path, Restart: keys[i].restart, Section: !keys[i].isValue()}
	}
	return out
}
