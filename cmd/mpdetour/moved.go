package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/mpdetour/mpdetour/internal/cli"
)

// movedToLab is a hidden command where a lab command used to be ("mpdetour
// lab ...", "mpdetour collective simulate"): it answers with a one-line
// pointer to the lab binary, the same arguments under their new name,
// instead of "unknown command".
func movedToLab(name, old, instead string) *cli.Command {
	return &cli.Command{
		Name:    name,
		Summary: "moved to the lab binary: " + instead,
		Hidden:  true,
		RawArgs: true,
		Run: func(_ context.Context, args []string) error {
			return fmt.Errorf("%q moved to the lab binary, mpdetour-lab (make build puts it beside mpdetour): run %s",
				old, strings.Join(append([]string{instead}, args...), " "))
		},
	}
}
