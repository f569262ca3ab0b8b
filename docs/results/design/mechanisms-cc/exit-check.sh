#!/bin/bash
# Functional check of the agent's routes at exit (not a measurement): the real
# mpdetour agent with a static NAT detour and subflow_congestion: {detour: bbr}.
# The detour's relay address answers with a reset (no relay runs): the route is
# added before SUBFLOW_CREATE whatever the subflow's fate. Then SIGTERM (routes
# removed), and SIGKILL + restart (the next agent removes what the dead one left).
# usage: exit-check.sh MPDETOUR_BINARY
set -u
BIN=$1
C=sccx-c-$$; S=sccx-s-$$; D=$(mktemp -d)
cleanup() { [ -n "${AG:-}" ] && kill -9 $AG 2>/dev/null; [ -n "${CL:-}" ] && kill $CL 2>/dev/null; [ -n "${SV:-}" ] && kill $SV 2>/dev/null
  ip netns del $C 2>/dev/null; ip netns del $S 2>/dev/null; [ -z "$KEEP" ] && rm -rf $D; echo "logs: $D"; }
trap cleanup EXIT
KEEP=${KEEP:-}
ip netns add $C; ip netns add $S
ip link add sccx0 netns $C type veth peer name sccx1 netns $S
ip -n $C addr add 10.241.0.1/24 dev sccx0; ip -n $C link set sccx0 up; ip -n $C link set lo up
ip -n $S addr add 10.241.0.2/24 dev sccx1; ip -n $S addr add 10.242.0.9/32 dev sccx1; ip -n $S link set sccx1 up; ip -n $S link set lo up
ip -n $C route add 10.242.0.0/24 via 10.241.0.2
ip netns exec $S python3 -c '
import socket
s=socket.socket(socket.AF_INET,socket.SOCK_STREAM,262); s.bind(("10.241.0.2",5201)); s.listen(8)
while True:
    c,_=s.accept()
    while c.recv(65536): pass
' & SV=$!
cat > $D/agent.yaml <<YAML
netns: $C
socket: $D/agent.sock
subflows: 1
subflow_congestion: {detour: bbr}
detours:
  - {kind: nat, relay: d1, address: 10.242.0.9:4000, server: 10.241.0.2:5201}
YAML
client() { ip netns exec $C python3 -c '
import socket,time
s=socket.socket(socket.AF_INET,socket.SOCK_STREAM,262); s.connect(("10.241.0.2",5201))
t=time.time()
while time.time()-t<3: s.send(b"x"*1000); time.sleep(0.01)
' 2>>$D/client.err & CL=$!; }
# waitroute: poll until the agent's route appears (the client is slow to start under load)
waitroute() { for i in $(seq 100); do [ -n "$(ip -n $C route show table all proto 109)" ] && return; sleep 0.1; done; echo "(no route within 10 s)"; }
routes() { echo "routes (proto 109): [$(ip -n $C route show table all proto 109 | tr '\n' ';')]"; }
$BIN agent --config $D/agent.yaml 2> $D/agent.log & AG=$!
sleep 1.5; client; waitroute
echo "== agent running, one connection:"; routes
$BIN status --socket $D/agent.sock 2>&1 | grep -A2 "subflow congestion"
grep -o 'msg="subflow congestion[^"]*"[^=]*=[^ ]*' $D/agent.log | head -3
kill -TERM $AG; wait $AG; AG=
echo "== after SIGTERM:"; routes
wait $CL 2>/dev/null; CL=
$BIN agent --config $D/agent.yaml 2> $D/agent2.log & AG=$!
sleep 1.5; client; waitroute
echo "== second agent, one connection:"; routes
kill -9 $AG; wait $AG 2>/dev/null; AG=
echo "== after SIGKILL:"; routes
wait $CL 2>/dev/null; CL=
$BIN agent --config $D/agent.yaml 2> $D/agent3.log & AG=$!
sleep 1.5
echo "== third agent started:"; routes
grep -o 'msg="removed a route left by an earlier agent"[^\n]*' $D/agent3.log
kill -TERM $AG; wait $AG; AG=
echo "== after SIGTERM:"; routes
