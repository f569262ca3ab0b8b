package topology

import (
	"net/netip"
	"testing"
)

func TestV6Twins(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"10.0.1.1/24", "fd6c:6162::a00:101/120"},
		{"0.0.0.0/0", "::/0"},
		{"10.0.3.2/32", "fd6c:6162::a00:302/128"},
	} {
		if got := V6Prefixed(netip.MustParsePrefix(c.in)); got.String() != c.want {
			t.Errorf("V6Prefixed(%s) = %s, want %s", c.in, got, c.want)
		}
	}
	a := netip.MustParseAddr("10.0.6.2")
	if V4(V6(a)) != a || V4(netip.MustParseAddr("2001:db8::1")).Is4() {
		t.Errorf("V4 does not invert V6")
	}
	b, _ := Builtin("detours")
	if b.Family() != Family4 {
		t.Errorf("default family %s", b.Family())
	}
	if b.Params()["family"] != "" {
		t.Errorf("the default family appears among the parameters (it would change every existing record)")
	}
	if err := b.Set("family", "dual"); err != nil || b.Family() != FamilyDual {
		t.Errorf("Set family=dual: %v, %s", err, b.Family())
	}
}
