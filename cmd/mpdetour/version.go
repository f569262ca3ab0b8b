package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"

	"github.com/mpdetour/mpdetour/internal/cli"
	"github.com/mpdetour/mpdetour/internal/version"
)

// versionCommand builds the version subcommand.
func versionCommand() *cli.Command {
	var asJSON bool
	return &cli.Command{
		Name:    "version",
		Summary: "print the mpdetour version (and the commit it was built from)",
		Usage:   "[--json]",
		Flags: func(fs *flag.FlagSet) {
			fs.BoolVar(&asJSON, "json", false, "print version, revision (full commit), time, modified and go as JSON")
		},
		Run: func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return cli.Usagef("version takes no arguments")
			}
			in := version.Get()
			if asJSON {
				enc := json.NewEncoder(os.Stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(in)
			}
			fmt.Println("mpdetour", in.String())
			return nil
		},
	}
}
