import subprocess


def test_real_sshd_accepts_the_client_key(sshd, client_key):
    out = subprocess.run(
        ["ssh", "-i", str(client_key[0]), "-p", str(sshd.port), "-o", "StrictHostKeyChecking=no",
         "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", f"{sshd.user}@127.0.0.1",
         "echo hello-from-sshd"],
        capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "hello-from-sshd"
