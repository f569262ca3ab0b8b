package main

import (
	"context"
	"fmt"

	"github.com/mpdetour/mpdetour/internal/cli"
	"github.com/mpdetour/mpdetour/internal/version"
)

func init() {
	cli.Register(&cli.Command{
		Name:    "version",
		Summary: "print the mpdetour version",
		Order:   100,
		Run: func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return cli.Usagef("version takes no arguments")
			}
			fmt.Println("mpdetour", version.String())
			return nil
		},
	})
}
