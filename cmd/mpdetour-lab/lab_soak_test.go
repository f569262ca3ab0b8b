package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/mpdetour/mpdetour/internal/cli"
)

func runSoak(args ...string) error {
	c := labSoakCommand()
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.Flags(fs)
	if err := fs.Parse(args); err != nil {
		return &cli.UsageError{Msg: err.Error()}
	}
	return c.Run(context.Background(), fs.Args())
}

// --attacks: wrong names, repeats and a soak too short for one case are
// usage errors naming the problem, before any lab is built.
func TestSoakAttacksFlagErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--attacks", "junk"}, `unknown case "junk"`},
		{[]string{"--attacks", "forged-gossip,forged-gossip"}, `"forged-gossip" named twice`},
		{[]string{"--attacks", "forged-gossip,,convert-socket"}, "empty case name"},
		{[]string{"--attacks", "destinations-v6"}, `unknown case "destinations-v6"`}, // the suite's, not in place
		{[]string{"--attacks", "all", "--duration", "60s"}, "too short for --attacks"},
		{[]string{"--attacks", "all", "--duration", "3m"}, "at least 6 x --attack-every + 1m0s = 4m0s"},
		{[]string{"--attacks", "all", "--attack-every", "1s", "--duration", "10m"}, "--attack-every 1s is too short"},
	} {
		err := runSoak(c.args...)
		var ue *cli.UsageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want a usage error containing %q", c.args, err, c.want)
		}
	}
}

func TestParseSoakAttacks(t *testing.T) {
	for _, c := range []struct {
		list string
		want []string
	}{
		{"", nil},
		{"all", []string{"spoofed-junk", "forged-gossip", "convert-socket", "rotation-quota", "revoked-conversion", "subflow-churn"}},
		{" subflow-churn , spoofed-junk", []string{"subflow-churn", "spoofed-junk"}},
		{"convert-socket", []string{"convert-socket"}},
	} {
		got, err := parseSoakAttacks(c.list, 30*time.Second, 10*time.Minute)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("%q: %v, %v; want %v", c.list, got, err, c.want)
		}
	}
	// No attack asked: any duration will do (the soak's own minimum applies).
	if got, err := parseSoakAttacks("", 30*time.Second, 30*time.Second); got != nil || err != nil {
		t.Errorf("no attacks in a short soak: %v, %v", got, err)
	}
}

// --help lists every in-place case.
func TestSoakHelpListsAttacks(t *testing.T) {
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	labSoakCommand().Flags(fs)
	usage := fs.Lookup("attacks").Usage
	for _, c := range []string{"spoofed-junk", "forged-gossip", "convert-socket", "rotation-quota", "revoked-conversion", "subflow-churn"} {
		if !strings.Contains(usage, c) {
			t.Errorf("--attacks help lacks %s: %s", c, usage)
		}
	}
}

// --subflow-lowat outside the agent's range is a usage error naming the
// range, before any lab is built.
func TestSoakSubflowLowatFlagErrors(t *testing.T) {
	for _, v := range []string{"-1", "100", "16383", "2147483648"} {
		err := runSoak("--subflow-lowat", v)
		var ue *cli.UsageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), "--subflow-lowat "+v+" is not 0 (off) or 16384-2147483647 bytes") {
			t.Errorf("--subflow-lowat %s: %v, want a usage error naming the range", v, err)
		}
	}
}
