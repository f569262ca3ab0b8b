package agent

import (
	"strings"
	"testing"

	"github.com/mpdetour/mpdetour/internal/testenv"
)

const module = "github.com/mpdetour/mpdetour"

// clientPackages are the detour kinds' and roles' packages and the
// control protocol: internal/agentd builds them and hands the core their
// sources, so the core links none of them.
var clientPackages = []string{
	"/internal/agentd", "/internal/relayclient", "/internal/legacyclient", "/internal/convclient",
	"/internal/serverrole", "/internal/pathcheck", "/internal/proto", "/internal/tunnel", "/internal/relayconn",
	"/internal/relay",
}

// clientPackage says whether pkg is (under) one of clientPackages or a
// detour kind's package (under internal/detour/).
func clientPackage(pkg string) bool {
	if strings.HasPrefix(pkg, module+"/internal/detour/") {
		return true
	}
	for _, p := range clientPackages {
		if pkg == module+p || strings.HasPrefix(pkg, module+p+"/") {
			return true
		}
	}
	return false
}

// The agent core takes its detour sources, it does not build them:
// `go list -deps` of this package (tests excluded) names no client package.
func TestCoreImportsNoClientPackage(t *testing.T) {
	deps := testenv.Deps(t, module+"/internal/agent")
	for _, pkg := range deps {
		if clientPackage(pkg) {
			t.Errorf("internal/agent depends on %s: build sources and roles in internal/agentd and pass them in (find the chain with: go list -deps -f '{{.ImportPath}}: {{.Imports}}' ./internal/agent)", pkg)
		}
	}
}

// clientPackage recognises the client packages (so that the test above
// can fail) and lets the core's own dependencies through.
func TestClientPackage(t *testing.T) {
	for _, pkg := range []string{module + "/internal/relayclient", module + "/internal/tunnel/tunnelctl", module + "/internal/agentd",
		module + "/internal/proto", module + "/internal/convclient", module + "/internal/serverrole", module + "/internal/relay/trust",
		module + "/internal/detour/static"} {
		if !clientPackage(pkg) {
			t.Errorf("%s not recognised as a client package", pkg)
		}
	}
	for _, pkg := range []string{module + "/internal/agent", module + "/internal/policy", module + "/internal/mptcppm",
		module + "/internal/detour", module + "/internal/relayd", module + "/internal/protocol"} {
		if clientPackage(pkg) {
			t.Errorf("%s flagged as a client package", pkg)
		}
	}
}
