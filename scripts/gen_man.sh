#!/bin/sh
# gen_man.sh BINARY: writes the man page shoal(1) to stdout, made from the binary's own help
# (`shoal --help` and `shoal COMMAND --help` for every command it lists), so the page never
# drifts from the options the program accepts. Used by `make install` (build/shoal.1).
set -e
BIN=${1:?usage: gen_man.sh path/to/shoal}
VERSION=$("$BIN" --version 2>/dev/null | head -n 1 | sed 's/^shoal //')

# esc: troff-safe text (backslashes, and lines that would start a request).
esc() { sed -e 's/\\/\\e/g' -e "s/^\\([.']\\)/\\\\\\&\\1/"; }

cat <<HEAD
.TH SHOAL 1 "" "shoal $VERSION" "User Commands"
.SH NAME
shoal \\- run a language model across the machines of a local network
.SH SYNOPSIS
.B shoal
.I COMMAND
.RI [ OPTIONS ]
.br
.B shoal
.BR \\-\\-help " | " \\-\\-version
.SH DESCRIPTION
.nf
HEAD
"$BIN" --help 2>&1 | sed '1,/^$/d; /^commands:/,$d' | esc
echo ".fi"
echo ".SH COMMANDS"
for cmd in $("$BIN" --help 2>&1 | sed -n '/^commands:/,/^$/s/^  \([a-z][a-z-]*\)  .*/\1/p'); do
	echo ".SS shoal $cmd"
	echo ".nf"
	"$BIN" "$cmd" --help 2>&1 | esc || true
	echo ".fi"
done
cat <<'TAIL'
.SH ENVIRONMENT
.TP
.B SHOAL_TOKEN
the cluster's token, when neither \-\-token nor \-\-token\-file is given
.TP
.B SHOAL_LOG
log level: error, warn, info, debug
.SH FILES
.TP
.I /etc/shoal/token
the token read by the systemd unit (mode 0600, owner root)
.TP
.I /var/lib/shoal
the state directory of a system-wide agent (node ID, hostfiles, RDMA matrix)
.TP
.I shoal.service
the systemd unit that runs \fBshoal agent\fR and restarts it on failure
.SH SEE ALSO
.BR systemctl (1),
.BR avahi-daemon (8)
TAIL
