package main

import "github.com/mpdetour/mpdetour/internal/cli"

// printJSON writes v to stdout as indented JSON, the form every --json flag prints.
func printJSON(v any) error { return cli.PrintJSON(v) }
