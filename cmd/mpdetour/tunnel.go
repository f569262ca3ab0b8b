package main

// Tunnel detours (docs/tunnel.md): importing tunnelctl registers the relay's
// tunnel factory, which serves the relay config's `tunnel:` section. The
// agent side is tunnelctl.StartAll (one tunnel Source per relay).
import _ "github.com/mpdetour/mpdetour/internal/tunnel/tunnelctl"
