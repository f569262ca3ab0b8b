# mpdetour: `make demo` runs the main job, `make test` runs every test.
# Both do their own setup (Debian packages, Go modules, staticcheck).

GO        ?= go
BIN       := bin/mpdetour
LABBIN    := bin/mpdetour-lab
GOBIN     := $(shell $(GO) env GOPATH)/bin
VERSION   := $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X github.com/mpdetour/mpdetour/internal/version.Version=$(VERSION)
# Integration tests share the kernel and measure timing: one package at a time.
TESTFLAGS ?= -p 1 -count=1 -timeout 15m
FUZZTIME  ?= 10s
# The soak in `make test` (docs/results/soak has the 1-hour one: make soak SOAKTIME=1h).
SOAKTIME  ?= 5m
# Attack cases the soak runs in place (docs/lab.md "lab soak"): the two
# cheap ones (~0.2 s each per run; the soak's duration is fixed, so no
# wall time is added). SOAKATTACKS=all for every case, SOAKATTACKS= for none.
SOAKATTACKS ?= convert-socket,rotation-quota

# Debian packages (make package): into PKGDIR.
PKGDIR    ?= dist

.PHONY: all setup build build-host test vet staticcheck unit fuzz soak fuzz-and-soak soak-then-package-test fuzz-soak-package demo clean package package-test tidy

all: build

setup:
	@scripts/setup.sh

# Both binaries: mpdetour (the product: relay and agent hosts need only
# this one) and mpdetour-lab (the evaluation lab, which starts the mpdetour
# beside it in its lab nodes).
build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/mpdetour
	$(GO) build -ldflags "$(LDFLAGS)" -o $(LABBIN) ./cmd/mpdetour-lab

# The product binary alone (what relay and agent hosts install).
build-host:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/mpdetour

vet:
	$(GO) vet ./...

staticcheck:
	$(GOBIN)/staticcheck ./...

# go test -json through testsummary: the usual output, then the list of
# skipped tests; with CI=true a skip for a missing tool fails the run.
# Tests that run the binaries take those make build just made (bin/)
# instead of each linking its own.
unit: build
	MPDETOUR_TEST_BINDIR=$(CURDIR)/bin $(GO) run ./internal/testenv/testsummary -- $(GO) test -json $(TESTFLAGS) ./...

# go.mod and go.sum are what `go mod tidy` makes of them.
tidy:
	$(GO) mod tidy -diff

# Every fuzz target runs for a bounded time (FUZZTIME each).
fuzz:
	@scripts/fuzz.sh $(FUZZTIME)

# Churn against real relays and an agent in a lab of its own; fails when
# memory, fds, goroutines, mappings or WireGuard peers grow (docs/lab.md).
soak: build
	$(LABBIN) soak --duration $(SOAKTIME) --name soakmk --attacks '$(SOAKATTACKS)'

# The soak mostly waits: it runs beside the fuzzers.
fuzz-and-soak:
	@$(MAKE) --no-print-directory -j2 fuzz soak

# The soak, then the package test, go.mod tidiness and staticcheck, one
# after the other: together shorter than the fuzz run beside them (38
# targets of FUZZTIME each, plus their builds).
# Every step runs even when an earlier one failed (a red run names every
# failure, not the first); the lane fails if any step did.
soak-then-package-test:
	@rc=0; for t in soak package-test tidy staticcheck; do \
		$(MAKE) --no-print-directory $$t || { echo "make test: $$t failed"; rc=1; }; \
	done; exit $$rc

# What make test runs after the unit tests: the fuzzers in one lane, the
# soak, the package test and the static checks in the other.
fuzz-soak-package:
	@$(MAKE) --no-print-directory -k -j2 fuzz soak-then-package-test

# mpdetour and mpdetour-relay .deb packages (packaging/build-deb.sh; GOARCH=arm64
# for another architecture, PKGVERSION to override the version).
package:
	@packaging/build-deb.sh $(PKGDIR)

# Installs them into a clean Debian root (mmdebstrap) and checks binary,
# units, configs, keys and a reinstall over a changed config (~1 min).
package-test: package
	@packaging/test-deb.sh $(PKGDIR)

# The leak check compares namespaces, root-namespace links and nft tables,
# and mpdetour processes before and after the run and names what it left.
test: setup
	@scripts/leakcheck.sh $(MAKE) --no-print-directory build vet unit fuzz-soak-package
	@echo "make test: all checks passed"

demo: setup build
	@scripts/demo.sh

clean:
	rm -rf bin dist
