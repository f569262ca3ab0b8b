package relayclient

import (
	"strings"
	"testing"

	"github.com/mpdetour/mpdetour/internal/proto"
)

func TestFileConfig(t *testing.T) {
	priv, _ := proto.GenerateKey()
	rk, _ := proto.GenerateKey()
	good := FileConfig{Key: priv.String(), Servers: []FileRelay{{Name: "r1", Address: "203.0.113.1:45673", PublicKey: rk.Public().String()}}}
	sc, err := good.Build()
	if err != nil || sc.PrivateKey != priv || len(sc.Relays) != 1 || sc.Relays[0].PublicKey != rk.Public() || sc.Relays[0].Addr.Port() != 45673 {
		t.Fatalf("%+v %v", sc, err)
	}
	bad := map[string]FileConfig{
		"key (or key_file)":     {Servers: good.Servers},
		"exclusive":             {Key: "a", KeyFile: "b", Servers: good.Servers},
		"servers: at least":     {Key: priv.String()},
		"servers[0].address":    {Key: priv.String(), Servers: []FileRelay{{Name: "r", Address: "nowhere", PublicKey: rk.String()}}},
		"servers[0].public_key": {Key: priv.String(), Servers: []FileRelay{{Name: "r", Address: "1.2.3.4:1", PublicKey: "x"}}},
		"servers[1].name":       {Key: priv.String(), Servers: append(append([]FileRelay{}, good.Servers...), good.Servers...)},
	}
	for want, fc := range bad {
		if _, err := fc.Build(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%+v: error %v, want %q", fc, err, want)
		}
	}
}
