package topology

import (
	"fmt"
	"sort"
	"strings"
)

// Set applies one --set override. Keys:
//
//	profile, variant, detours, shared  built-in parameters (regenerate the topology)
//	family                         4, 6 or dual: the address families built (every built-in)
//	LINK.FIELD                     both directions of one link
//	LINK.ab.FIELD, LINK.ba.FIELD   one direction (ab = from endpoint a to b)
//	CLASS.FIELD, all.FIELD         every link of a class ("core", "access") or every link
//
// FIELD is rate, delay, loss or queue. Link overrides survive a later
// parameter change: they are replayed on the regenerated topology.
func (t *Topology) Set(key, value string) error {
	bad := func(format string, a ...any) error {
		return &Error{Source: t.Source, Field: "--set " + key + "=" + value, Msg: fmt.Sprintf(format, a...)}
	}
	if t.builtin != nil {
		if _, ok := t.builtin.defaults[key]; ok || key == familyParam {
			check := t.builtin.check
			if key == familyParam {
				check = func(_, v string) error { return checkFamily(v) }
			}
			if err := check(key, value); err != nil {
				return bad("%v", err)
			}
			params := t.Params()
			params[key] = value
			if t.builtin.checkAll != nil {
				if err := t.builtin.checkAll(params); err != nil {
					return bad("%v", err)
				}
			}
			nt := t.builtin.instantiate(params)
			for _, kv := range t.sets {
				if err := nt.setLink(kv[0], kv[1]); err != nil {
					// A link override that no longer applies (e.g. C3 after
					// detours=2) is an error of the parameter change.
					return bad("override %s=%s no longer applies: %v", kv[0], kv[1], err)
				}
			}
			nt.sets = t.sets
			*t = *nt
			return nil
		}
	}
	if err := t.setLink(key, value); err != nil {
		return bad("%v", err)
	}
	t.sets = append(t.sets, [2]string{key, value})
	return nil
}

func (t *Topology) setLink(key, value string) error {
	parts := strings.Split(key, ".")
	var target, dir, field string
	switch len(parts) {
	case 2:
		target, field = parts[0], parts[1]
	case 3:
		target, dir, field = parts[0], parts[1], parts[2]
		if dir != "ab" && dir != "ba" {
			return fmt.Errorf("direction must be ab or ba, not %q", dir)
		}
	default:
		return fmt.Errorf("unknown key (want LINK.FIELD, LINK.ab.FIELD, CLASS.FIELD, all.FIELD%s)", t.paramHint())
	}
	var links []*Link
	for _, l := range t.Links {
		if l.Name == target || l.Class == target || target == "all" {
			links = append(links, l)
		}
	}
	if len(links) == 0 {
		return fmt.Errorf("no link or class named %q", target)
	}
	var apply func(*Shape)
	switch field {
	case "rate":
		r, err := ParseRate(value)
		if err != nil {
			return err
		}
		apply = func(s *Shape) { s.Rate = r }
	case "delay":
		d, err := ParseDelay(value)
		if err != nil {
			return err
		}
		apply = func(s *Shape) { s.Delay = d }
	case "loss":
		l, err := ParseLoss(value)
		if err != nil {
			return err
		}
		apply = func(s *Shape) { s.Loss = l }
	case "queue":
		q, err := ParseQueue(value)
		if err != nil {
			return err
		}
		apply = func(s *Shape) { s.Queue = q }
	default:
		return fmt.Errorf("unknown field %q (rate, delay, loss, queue)", field)
	}
	for _, l := range links {
		if dir != "ba" {
			apply(&l.AB)
		}
		if dir != "ab" {
			apply(&l.BA)
		}
	}
	return nil
}

func (t *Topology) paramHint() string {
	if t.builtin == nil {
		return ""
	}
	var ks []string
	ks = append(ks, familyParam)
	for k := range t.builtin.defaults {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ", or a parameter: " + strings.Join(ks, ", ")
}
