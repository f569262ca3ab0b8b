package main

import (
	"context"
	"fmt"

	"github.com/mpdetour/mpdetour/internal/cli"
	"github.com/mpdetour/mpdetour/internal/version"
)

// versionCommand builds the version subcommand.
func versionCommand() *cli.Command {
	return &cli.Command{
		Name:    "version",
		Summary: "print the mpdetour version",
		Run: func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return cli.Usagef("version takes no arguments")
			}
			fmt.Println("mpdetour", version.String())
			return nil
		},
	}
}
