#!/usr/bin/env python3
"""Fan-out benchmark: vigil on 1 and 10 hosts over SSH. Each "host" is a real sshd (Debian's
openssh-server) on a loopback port with its own state dir and its own llama-server port (sshd_config
SetEnv), so one machine stands in for ten nodes. Measures, per host count: `up --hosts` to every
verdict (launch + log-based readiness; --no-probe because the port is chosen per host by the node's
environment), `status --hosts`, `down --hosts`, and the SSH connections sshd accepted per command.
Prints a Markdown table. Run as root or a normal user (sshd then serves that user only).

  python3 scripts/bench_fanout.py [--runs 5]
"""
import argparse, os, pwd, shutil, socket, statistics, subprocess, sys, tempfile, time

HOME = os.path.expanduser("~")
LLAMA = os.environ.get("VIGIL_LLAMA_SERVER", f"{HOME}/.cache/vigil/llama-server-0.3.36-rpc/bin/llama-server")
MODELS = os.environ.get("VIGIL_MODELS", f"{HOME}/.cache/vigil/models-v3")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VIGIL = os.environ.get("VIGIL_BIN", f"{ROOT}/target/release/vigil")


def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p


def start_hosts(tmp, n):
    user = pwd.getpwuid(os.getuid()).pw_name
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", f"{tmp}/user"], check=True)
    if os.getuid() == 0:
        os.makedirs("/run/sshd", exist_ok=True)
    procs, cfg = [], []
    for i in range(n):
        d = f"{tmp}/h{i}"; os.makedirs(d)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", f"{d}/host"], check=True)
        shutil.copy(f"{tmp}/user.pub", f"{d}/authorized_keys")
        port = free_port()
        open(f"{d}/sshd_config", "w").write(
            f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host\nAuthorizedKeysFile {d}/authorized_keys\n"
            f"PasswordAuthentication no\nPermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\n"
            f"LogLevel VERBOSE\nSetEnv XDG_STATE_HOME={d}/state LLAMA_PORT={free_port()}\n")
        procs.append(subprocess.Popen(["/usr/sbin/sshd", "-D", "-E", f"{d}/sshd.log", "-f", f"{d}/sshd_config"]))
        hk = open(f"{d}/host.pub").read().split()[:2]
        open(f"{d}/known_hosts", "w").write(f"[127.0.0.1]:{port} {hk[0]} {hk[1]}\n")
        cfg.append(f"Host h{i}\n  HostName 127.0.0.1\n  Port {port}\n  User {user}\n  IdentityFile {tmp}/user\n"
                   f"  IdentitiesOnly yes\n  UserKnownHostsFile {d}/known_hosts\n")
        for _ in range(500):
            try:
                socket.create_connection(("127.0.0.1", port), 0.1).close(); break
            except OSError:
                time.sleep(0.01)
    open(f"{tmp}/ssh_config", "w").write("".join(cfg)); os.chmod(f"{tmp}/ssh_config", 0o600)
    return procs


def accepted(tmp, n):
    return sum(open(f"{tmp}/h{i}/sshd.log").read().count("Accepted publickey") for i in range(n))


def timed(tmp, args):
    t = time.monotonic()
    r = subprocess.run([VIGIL, "--ssh-config", f"{tmp}/ssh_config", *args], capture_output=True, text=True,
                       timeout=300)
    return (time.monotonic() - t) * 1000, r


def main():
    ap = argparse.ArgumentParser(); ap.add_argument("--runs", type=int, default=5); a = ap.parse_args()
    if not os.path.exists(VIGIL):
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "vigil"], cwd=ROOT, check=True)
    print(f"## Fan-out over SSH ({a.runs} runs each; real sshd per host on loopback; tiny llama-server per host)\n")
    print("| hosts | --parallel | up → all ready, median ms | status median ms | down median ms | "
          "SSH connections per command | field loop: one poll of every host (ssh + curl /health), median ms "
          "/ connections |")
    print("|---|---|---|---|---|---|---|")
    for n, par in [(1, 1), (10, 10), (10, 1)]:
        tmp = tempfile.mkdtemp(prefix="vf-", dir="/tmp")
        procs = start_hosts(tmp, n)
        hosts = ",".join(f"h{i}" for i in range(n))
        ups, sts, dns, conns, polls, pconns = [], [], [], set(), [], set()
        try:
            for _ in range(a.runs):
                c0 = accepted(tmp, n)
                ms, r = timed(tmp, ["--hosts", hosts, "--parallel", str(par), "up", "--detach", "--no-check",
                                    "--no-probe", "--server", "llama-cpp", "--name", "b", "--", "sh", "-c",
                                    'exec "$@" --port "$LLAMA_PORT"', "sh", LLAMA, "-m", f"{MODELS}/tiny.gguf"])
                assert r.returncode == 0, r.stdout + r.stderr
                ups.append(ms); conns.add(accepted(tmp, n) - c0)
                ms, r = timed(tmp, ["--hosts", hosts, "--parallel", str(par), "status"])
                assert r.returncode == 0 and r.stdout.count(" ready ") == n, r.stdout + r.stderr
                sts.append(ms)
                # the field practice: one ssh per host per poll, curl /health there
                c0 = accepted(tmp, n); t = time.monotonic()
                for i in range(n):
                    r = subprocess.run(["ssh", "-F", f"{tmp}/ssh_config", "-o", "BatchMode=yes", f"h{i}",
                                        'curl -s -o /dev/null -w %{http_code} http://127.0.0.1:$LLAMA_PORT/health'],
                                       capture_output=True, text=True, timeout=60)
                    assert r.stdout == "200", r.stdout + r.stderr
                polls.append((time.monotonic() - t) * 1000); pconns.add(accepted(tmp, n) - c0)
                ms, r = timed(tmp, ["--hosts", hosts, "--parallel", str(par), "down", "b"])
                assert r.returncode == 0, r.stdout + r.stderr
                dns.append(ms)
        finally:
            for p in procs:
                p.kill()
            shutil.rmtree(tmp, ignore_errors=True)
        print(f"| {n} | {par} | {statistics.median(ups):.0f} | {statistics.median(sts):.0f} | "
              f"{statistics.median(dns):.0f} | {'/'.join(str(c) for c in sorted(conns))} (= hosts) | "
              f"{statistics.median(polls):.0f} / {'/'.join(str(c) for c in sorted(pconns))} per poll |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
