package topology

import "testing"

func TestCollective(t *testing.T) {
	c, err := Builtin("collective")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if len(c.Nodes) != 20+5+2 || len(c.Links) != 20+5+1 {
		t.Errorf("default: %d nodes, %d links", len(c.Nodes), len(c.Links))
	}
	if c.Primary("relay20").String() != "10.2.20.2" || c.Primary("client5").String() != "10.1.5.2" || c.Primary("server").String() != "10.0.3.2" {
		t.Errorf("addresses: relay20 %v client5 %v server %v", c.Primary("relay20"), c.Primary("client5"), c.Primary("server"))
	}
	if n := c.Node("relay3"); n == nil || !n.Forward {
		t.Error("relays must forward")
	}
	if err := c.Set("relays", "4"); err != nil {
		t.Fatal(err)
	}
	if err := c.Set("clients", "2"); err != nil {
		t.Fatal(err)
	}
	if err := c.Set("relay.rate", "100mbit"); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.Node("relay4") == nil || c.Node("relay5") != nil || c.Node("client3") != nil || len(c.Nodes) != 8 {
		t.Errorf("relays=4 clients=2: %d nodes", len(c.Nodes))
	}
	if c.Link("R4").AB.Rate != 100*mbit {
		t.Errorf("relay.rate not applied: %v", c.Link("R4").AB.Rate)
	}
	for _, kv := range [][2]string{{"relays", "1"}, {"relays", "41"}, {"relays", "x"}, {"clients", "0"}, {"clients", "17"}} {
		if err := c.Set(kv[0], kv[1]); err == nil {
			t.Errorf("Set(%s=%s) accepted", kv[0], kv[1])
		}
	}
	// The largest fits the node limit.
	if err := c.Set("relays", "40"); err != nil {
		t.Fatal(err)
	}
	if err := c.Set("clients", "16"); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}
