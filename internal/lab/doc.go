// Package lab builds emulated networks in Linux network namespaces: one
// named namespace per node, veth pairs for links, static routes, and link
// emulation (rate, delay, loss, queue) per direction. It is the project's
// test bench and the engine behind mpdetour-lab. docs/lab.md describes
// the topology file format, the built-ins and the measured fidelity.
//
// # API
//
// Describing a topology is package topology (internal/lab/topology):
//
//	func topology.Builtin(name string) (*Topology, error)   // "brennan2017", "detours"
//	func topology.LoadFile(path string) (*Topology, error)  // YAML; errors name file:line:column and field
//	func topology.Parse(source string, data []byte) (*Topology, error)
//	func (t *Topology) Set(key, value string) error // --set: profile=core-limited, variant=lossy,
//	                                                // detours=3, L2.loss=1%, L2.ab.delay=100ms,
//	                                                // core.rate=20mbit, all.queue=50
//	func (t *Topology) Validate() error
//	func (t *Topology) Node(name) *Node; Link(name) *Link; Primary(node) netip.Addr
//
// Errors about a topology are *topology.Error values (Source, Line, Col, Field, Msg).
//
// Running labs (all need root):
//
//	func Up(ctx context.Context, t *topology.Topology, name string) (*Lab, error)
//	func Open(name string) (*Lab, error)  // a lab built by any process, from /run/mpdetour/lab/NAME
//	func Down(name string) error          // idempotent; works after kill -9 of the builder
//	func List() ([]string, error)
//	func (l *Lab) Down() error
//	func (l *Lab) Name() string
//	func (l *Lab) Topology() *topology.Topology
//	func (l *Lab) Nodes() []string
//	func (l *Lab) NetnsName(node string) string  // "<lab>-<node>", for ip netns exec / ip -n
//	func (l *Lab) NetnsPath(node string) string  // /run/netns/<lab>-<node>
//	func (l *Lab) Addr(node string) netip.Addr   // primary address: client 10.0.1.1
//	func (l *Lab) Ifaces(node string) []Iface    // interface name (= link name), address, peer
//	func (l *Lab) Emulation() []LinkEmu          // how each link is emulated on this kernel
//	func (l *Lab) Command(ctx, node string, argv ...string) *exec.Cmd // runs inside node
//	func (l *Lab) Do(node string, fn func() error) error // fn on a locked thread inside node
//	func (l *Lab) Ping(ctx, node string, dst netip.Addr, count int, interval, timeout time.Duration) (PingResult, error)
//
// Names: node namespaces are "<lab>-<node>"; a link's interface on both
// endpoints is named after the link (client's L1, r1's L1 and L2, ...).
// Node and link names cannot contain '-', so "<lab>-" identifies a lab's
// namespaces even without its state (lab names may contain '-': the part
// after the lab name never does).
//
// # Emulation
//
// Rate: tbf on the sender's egress (limit = queue × 1514 bytes, bucket =
// max(2 frames, 1 ms)). Loss: netem where the kernel has it, otherwise an
// nftables netdev ingress chain on the receiving interface (numgen random
// mod 10^6 < p·10^6 drop) — dropped at the receiver so that the sender's
// TCP sees a real loss, not a local congestion signal. Delay: netem where
// present, otherwise the user-space delay line (internal/lab/delayline): the
// link then runs through a hidden middle namespace "<lab>-<link>" holding
// interfaces "a" and "b", and one detached process per lab (this binary
// re-executed, logs in /run/mpdetour/lab/NAME/delayline.log) moves frames
// between them after the configured delay. Offloads (TSO, GSO, GRO; and TX
// checksum on delay-line links) are off on every emulated interface.
//
// Command re-executes the current binary (/proc/self/exe), which enters
// the namespace during this package's initialisation and then executes
// the real program, so any program that imports this package can use it;
// the same mechanism runs the delay line.
package lab
