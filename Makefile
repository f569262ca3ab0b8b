# mpdetour: `make demo` runs the main job, `make test` runs every test.
# Both do their own setup (Debian packages, Go modules, staticcheck).

GO        ?= go
BIN       := bin/mpdetour
GOBIN     := $(shell $(GO) env GOPATH)/bin
VERSION   := $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X github.com/mpdetour/mpdetour/internal/version.Version=$(VERSION)
# Integration tests share the kernel and measure timing: one package at a time.
TESTFLAGS ?= -p 1 -count=1 -timeout 15m
FUZZTIME  ?= 10s

.PHONY: all setup build build-host test vet staticcheck unit fuzz demo clean

all: build

setup:
	@scripts/setup.sh

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/mpdetour

# The binary for relay and agent hosts: without `lab bench` (its report
# links the plotting library); every other subcommand is there.
build-host:
	$(GO) build -tags nolab -ldflags "$(LDFLAGS)" -o bin/mpdetour-host ./cmd/mpdetour

vet:
	$(GO) vet ./...
	$(GO) vet -tags nolab ./cmd/mpdetour

staticcheck:
	$(GOBIN)/staticcheck ./...

unit:
	$(GO) test $(TESTFLAGS) ./...

# Every fuzz target runs for a bounded time (FUZZTIME each).
fuzz:
	@scripts/fuzz.sh $(FUZZTIME)

# The leak check compares namespaces, root-namespace links and nft tables,
# and mpdetour processes before and after the run and names what it left.
test: setup
	@scripts/leakcheck.sh $(MAKE) --no-print-directory build vet staticcheck unit fuzz
	@echo "make test: all checks passed"

demo: setup build
	@scripts/demo.sh

clean:
	rm -rf bin
