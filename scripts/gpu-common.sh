# Sourced by the GPU end-to-end scripts: settings, PASS/FAIL bookkeeping, and (start_gpunode) a real
# sshd on a loopback port that makes this machine its own remote node "gpunode" (sshd/ssh and their
# libraries come from $CARRY when the image has none). Sets S (its dir), SP (its pid), R (vigil --host).
HERE=$(cd "$(dirname "$0")/.." && pwd)
V=${VIGIL:-$HERE/target/release/vigil}
OUT=${OUT:-$(mktemp -d)}
CARRY=${CARRY:-}
mkdir -p "$OUT"
FAIL=0
ok() { echo "PASS $1"; echo "PASS $1" >> "$OUT/summary.txt"; }
bad() { echo "FAIL $1"; echo "FAIL $1" >> "$OUT/summary.txt"; FAIL=1; }

start_gpunode() {  # PORT
  local sshd=/usr/sbin/sshd p=$1
  if [ ! -x "$sshd" ] || ! command -v ssh >/dev/null; then
    [ -n "$CARRY" ] || { bad "no sshd/ssh on this machine and no CARRY"; exit 1; }
    export PATH="$CARRY/bin:$PATH" LD_LIBRARY_PATH="$CARRY/lib"
    sshd=$CARRY/bin/sshd
  fi
  id sshd >/dev/null 2>&1 || useradd -r -M -d /run/sshd -s /usr/sbin/nologin sshd 2>/dev/null \
    || echo 'sshd:x:105:65534::/run/sshd:/usr/sbin/nologin' >> /etc/passwd
  mkdir -p /run/sshd; chmod 755 /run/sshd
  S=$(mktemp -d /tmp/vs.XXXXXX)
  ssh-keygen -q -t ed25519 -N '' -f "$S/host"; ssh-keygen -q -t ed25519 -N '' -f "$S/user"
  cp "$S/user.pub" "$S/authorized_keys"
  printf 'Port %s\nListenAddress 127.0.0.1\nHostKey %s/host\nAuthorizedKeysFile %s/authorized_keys\nPasswordAuthentication no\nPermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\nLogLevel VERBOSE\nSetEnv PATH=%s\n' \
    "$p" "$S" "$S" "$PATH" > "$S/sshd_config"
  "$sshd" -D -E "$S/sshd.log" -f "$S/sshd_config" & SP=$!
  for _ in $(seq 100); do (echo > /dev/tcp/127.0.0.1/$p) 2>/dev/null && break; sleep 0.1; done
  echo "[127.0.0.1]:$p $(cut -d' ' -f1,2 "$S/host.pub")" > "$S/known_hosts"
  printf 'Host gpunode\n  HostName 127.0.0.1\n  Port %s\n  User root\n  IdentityFile %s/user\n  IdentitiesOnly yes\n  UserKnownHostsFile %s/known_hosts\n' \
    "$p" "$S" "$S" > "$S/config"
  chmod 600 "$S/config"
  R="$V --ssh-config $S/config --host gpunode"
}
