package main

import (
	"encoding/json"
	"os"
)

// printJSON writes v to stdout as indented JSON, the form every --json flag prints.
func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
