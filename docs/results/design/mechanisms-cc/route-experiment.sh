# Route metric congctl on an MPTCP subflow (kernel 6.18), by hand. As root:
#   ALGO=bbr bash route-experiment.sh            the subflow to 10.78.0.2 runs bbr, the initial one cubic
#   ALGO=bbr LATE=reno bash route-experiment.sh  reno set on the MPTCP socket 0.3 s after connect: both reno
#   ALGO="lock bbr" LATE=reno bash ...           the late setsockopt fails with EPERM
LATE=${LATE:-}
set -x
C=sccC$$; S=sccS$$
cleanup(){ ip netns del $C; ip netns del $S; }
trap cleanup EXIT
ip netns add $C; ip netns add $S
ip link add scc0 netns $C type veth peer name scc1 netns $S
ip -n $C addr add 10.77.0.1/24 dev scc0; ip -n $C link set scc0 up; ip -n $C link set lo up
ip -n $S addr add 10.77.0.2/24 dev scc1; ip -n $S addr add 10.78.0.2/32 dev scc1; ip -n $S link set scc1 up; ip -n $S link set lo up
for n in $C $S; do ip netns exec $n sysctl -qw net.mptcp.enabled=1 net.mptcp.pm_type=0; ip -n $n mptcp limits set subflows 4 add_addr_accepted 4; done
ip -n $S mptcp endpoint add 10.78.0.2 signal
ip -n $C route add 10.78.0.2/32 via 10.77.0.2 dev scc0 congctl $ALGO
ip -n $C route show
ip netns exec $S python3 -c '
import socket
s=socket.socket(socket.AF_INET,socket.SOCK_STREAM,262); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1); s.bind(("0.0.0.0",5201)); s.listen(1)
c,_=s.accept()
while c.recv(65536): pass
' &
sleep 0.5
ip netns exec $C python3 -c '
import socket,time
s=socket.socket(socket.AF_INET,socket.SOCK_STREAM,262)
s.setsockopt(socket.IPPROTO_TCP,13,b"cubic")
s.connect(("10.77.0.2",5201))
if "'$LATE'": time.sleep(0.3); s.setsockopt(socket.IPPROTO_TCP,13,"'$LATE'".encode())
t=time.time(); b=b"x"*65536
while time.time()-t<3: s.send(b)
' &
sleep 1.5
ip netns exec $C ss -tin state established | grep -E "^|cubic|bbr|reno" 
ip netns exec $S ss -tin state established
wait
