// Package proto is the relay control protocol (v2) and the legacy v1 format.
//
// Transport: UDP (default port 45673). Identities are Curve25519 keys written
// in base64 as WireGuard writes them; a relay lists its members' public keys
// and each member knows the relay's public key.
//
// Handshake: Noise IK (25519, ChaChaPoly, BLAKE2s) via github.com/flynn/noise,
// as in WireGuard. The initiation (200 bytes) carries a TAI64N timestamp the
// relay requires to increase per member key (and remembers across restarts
// when it has a state file), so a captured initiation cannot be replayed.
// The response (60 bytes) is smaller than the initiation, and cookie replies
// (64 bytes) and cleartext refusals (16 bytes) smaller still, so a spoofed
// source never receives more than it sent. Initiations carry WireGuard's
// mac1/mac2; under load the relay answers initiations without a valid mac2
// with a cookie bound to the source address (cookie.go).
//
// Address proof: a session becomes usable only when the relay receives the
// first transport packet from the address the response went to; only a
// receiver of that response can produce it. Requests therefore travel in
// transport packets, never in the initiation: a member's key alone cannot
// obtain a mapping for an address it does not own. Clients hand shake at
// start-up and every RekeyAfter, so after first contact each request costs one
// round trip.
//
// Transport packets carry an explicit 64-bit counter used as the AEAD nonce
// and checked against a 1024-counter replay window; requests carry an id the
// reply echoes. Requests are idempotent (a repeated grant for the same
// server returns the same port), so clients simply retransmit.
//
// Messages (msg.go): ping, grant(server, proposed port) -> (detour addr:port,
// lease), renew(port) -> lease, release(port) -> bytes, tunnel() -> (client
// tunnel prefix, relay WireGuard endpoint and public key, lease). Every
// refusal carries a stable Reason code.
//
// Tunnel detours (for internal/tunnel): the client's WireGuard public key is
// its member key (the control-protocol static key), so the relay adds a peer
// with that key and the allocated address; see relay.Tunnels.
package proto
