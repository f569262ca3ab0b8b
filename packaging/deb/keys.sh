# Shared by the maintainer scripts (inlined at build time): make_key NAME
# creates /etc/mpdetour/NAME.key (mode 0600) and NAME.pub unless the key
# exists; an existing key is never replaced, only its mode is checked.
make_key() {
	key=/etc/mpdetour/$1.key
	if [ -e "$key" ]; then
		mode=$(stat -c %a "$key")
		case "$mode" in
		600|400) ;;
		*) echo "mpdetour: $key has mode $mode: the daemons refuse a key others can read; run: chmod 600 $key" >&2 ;;
		esac
	else
		tmp=$(mktemp /etc/mpdetour/.$1.key.XXXXXX)
		chmod 0600 "$tmp"
		/usr/bin/mpdetour relay genkey > "$tmp"
		mv "$tmp" "$key"
		echo "mpdetour: created $key (mode 0600)"
	fi
	if [ ! -e "/etc/mpdetour/$1.pub" ]; then
		/usr/bin/mpdetour relay pubkey < "$key" > "/etc/mpdetour/$1.pub"
		chmod 0644 "/etc/mpdetour/$1.pub"
	fi
}

reload_systemd() {
	if [ -d /run/systemd/system ]; then
		systemctl daemon-reload >/dev/null || true
	fi
}
