//! TLS with real GnuTLS clients against `raidnbd serve`: nbdinfo, nbdcopy, qemu-img,
//! qemu-io, python3-libnbd, with X.509 certificates and with PSK, and what must fail
//! (plaintext against require, a client certificate from another CA, a client that trusts
//! another CA, a wrong PSK, an export not open to the client); `--allow`; the config keys.
//! Credentials are made per test by crates/nbd-server/tests/make-pki.sh (certtool, psktool).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::util::*;

fn make_pki(dir: &Path) -> PathBuf {
    require_tool("certtool", "gnutls-bin");
    require_tool("psktool", "gnutls-bin");
    let out = dir.join("creds");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/nbd-server/tests/make-pki.sh");
    run_ok(Command::new(script).arg(&out));
    out
}

fn raid5(d: &Path) -> Vec<&'static str> {
    assert_ok(&raidnbd(d, &["create", "--level", "5", "--chunk", "64K", "--size", "32M", "m0", "m1", "m2", "m3"]));
    vec!["m0", "m1", "m2", "m3"]
}

/// Credentials (`make_pki`) and a RAID5 export "r5" served with `--tls require` and X.509.
fn x509_raid5(d: &Path) -> (PathBuf, Served) {
    let creds = make_pki(d);
    let members = raid5(d);
    let pki = creds.join("pki");
    let served = Served::start(d, "r5", &["--tls", "require", "--tls-certificates", pki.to_str().unwrap()], &members);
    (creds, served)
}

fn tls_uri(served: &Served, export: &str, query: &str) -> String {
    format!("nbds://localhost:{}/{export}?{query}", served.port)
}

#[track_caller]
fn assert_fails(cmd: &mut Command, what: &str) -> String {
    let out = output(cmd);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "{what}: must fail but succeeded: {text}");
    text
}

/// qemu-io over TLS: `--object CREDS --image-opts driver=nbd,...,tls-creds=tls0`.
fn qemu_io(served: &Served, export: &str, creds: &str, commands: &[&str]) -> Command {
    let mut cmd = Command::new("qemu-io");
    cmd.args(["--object", creds, "--image-opts"]);
    for c in commands {
        cmd.args(["-c", c]);
    }
    cmd.arg(format!("driver=nbd,host=localhost,port={},export={export},tls-creds=tls0", served.port));
    cmd
}

fn qemu_img_info(served: &Served, export: &str, creds: &str) -> Command {
    let mut cmd = Command::new("qemu-img");
    cmd.args(["info", "--object", creds, "--image-opts"]);
    cmd.arg(format!("driver=nbd,host=localhost,port={},export={export},tls-creds=tls0", served.port));
    cmd
}

/// python3-libnbd with TLS required: writes a pattern, flushes, reads it back.
fn python_tls(served: &Served, export: &str, setup: &str) -> Output {
    require_libnbd_python();
    let script = format!(
        r#"
import nbd
h = nbd.NBD()
h.set_tls(nbd.TLS_REQUIRE)
{setup}
h.set_export_name("{export}")
h.connect_tcp("localhost", "{port}")
assert h.get_tls_negotiated(), "TLS negotiated"
data = bytes((i * 7 + 3) & 0xff for i in range(1 << 20))
h.pwrite(data, 5 << 20, nbd.CMD_FLAG_FUA)
h.flush()
assert h.pread(1 << 20, 5 << 20) == data
h.shutdown()
print("python ok")
"#,
        port = served.port
    );
    output(Command::new(PYTHON).args(["-c", &script]))
}

#[test]
fn x509_serves_every_client_and_refuses_what_it_must() {
    require_tool("nbdinfo", "libnbd-bin");
    require_tool("nbdcopy", "libnbd-bin");
    require_tool("qemu-io", "qemu-utils");
    let dir = tempdir();
    let d = dir.path();
    let (creds, served) = x509_raid5(d);
    let pki = creds.join("pki");
    let pki_arg = pki.to_str().unwrap();
    let with = |dir: &str| tls_uri(&served, "r5", &format!("tls-certificates={}", creds.join(dir).display()));

    let info = run_ok(Command::new("nbdinfo").arg(with("pki")));
    assert!(info.contains("with TLS"), "{info}");
    // nbdcopy both ways.
    let payload: Vec<u8> = (0..16u32 << 20).map(|i| (i.wrapping_mul(2654435761) >> 11) as u8).collect();
    std::fs::write(d.join("payload"), &payload).unwrap();
    run_ok(Command::new("nbdcopy").arg(d.join("payload")).arg(with("pki")));
    run_ok(Command::new("nbdcopy").arg(with("pki")).arg(d.join("back")));
    assert_same_bytes(
        &std::fs::read(d.join("back")).unwrap()[..payload.len()],
        &payload,
        "nbdcopy round trip over TLS",
    );
    // qemu-io and qemu-img with tls-creds-x509.
    let x509 = format!("tls-creds-x509,id=tls0,endpoint=client,dir={pki_arg}");
    let io = run_ok(&mut qemu_io(&served, "r5", &x509, &["write -P 0x5a 30M 1M", "read -P 0x5a 30M 1M"]));
    assert!(!io.contains("Pattern verification failed"), "{io}");
    let info = run_ok(&mut qemu_img_info(&served, "r5", &x509));
    assert!(info.contains("virtual size"), "{info}");
    // python3-libnbd with set_tls(TLS_REQUIRE).
    let py = python_tls(&served, "r5", &format!("h.set_tls_certificates({pki_arg:?})"));
    assert!(py.status.success(), "python: {}", String::from_utf8_lossy(&py.stderr));

    // What must fail: plaintext against require; a client that trusts another CA.
    let plain = assert_fails(Command::new("nbdinfo").arg(served.uri("r5")), "plaintext nbdinfo");
    assert!(plain.contains("opt_go") || plain.contains("TLS"), "{plain}");
    assert_fails(Command::new("nbdinfo").arg(with("foreign-ca")), "nbdinfo trusting another CA");
    let foreign = format!("tls-creds-x509,id=tls0,endpoint=client,dir={}", creds.join("foreign-ca").display());
    assert_fails(&mut qemu_img_info(&served, "r5", &foreign), "qemu-img trusting another CA");
    assert_fails(Command::new("qemu-img").args(["info", &served.uri("r5")]), "plaintext qemu-img");
    // The data is all there after all that.
    run_ok(&mut qemu_io(&served, "r5", &x509, &["read -P 0x5a 30M 1M"]));
    let log = served.stop();
    assert!(log.contains("TLS require"), "start-up says TLS: {log}");
    // Which way TLS ran is logged (this machine's kernel decides: the VM rig has kernel TLS).
    assert!(log.contains("kernel TLS available") || log.contains("kernel TLS unavailable"), "{log}");
}

#[test]
fn verified_client_certificates_and_per_export_peers() {
    require_tool("nbdinfo", "libnbd-bin");
    require_tool("qemu-img", "qemu-utils");
    let dir = tempdir();
    let d = dir.path();
    let creds = make_pki(d);
    let pki = creds.join("pki");
    let members = raid5(d);
    let pki_arg = pki.to_str().unwrap();
    let tls = ["--tls", "require", "--tls-certificates", pki_arg, "--tls-verify-peer"];
    let args: Vec<&str> = tls.iter().copied().chain(["--tls-peer", "client1.test"]).collect();
    let served = Served::start(d, "r5", &args, &members);
    let with = |dir: &str| tls_uri(&served, "r5", &format!("tls-certificates={}", creds.join(dir).display()));
    run_ok(Command::new("nbdinfo").arg(with("pki")));
    let x509 = format!("tls-creds-x509,id=tls0,endpoint=client,dir={pki_arg}");
    run_ok(&mut qemu_img_info(&served, "r5", &x509));
    // A client certificate from another CA.
    assert_fails(Command::new("nbdinfo").arg(with("foreign-client")), "nbdinfo with a foreign client certificate");
    let foreign = format!("tls-creds-x509,id=tls0,endpoint=client,dir={}", creds.join("foreign-client").display());
    assert_fails(&mut qemu_img_info(&served, "r5", &foreign), "qemu-img with a foreign client certificate");
    let log = served.stop();
    assert!(log.contains("TLS handshake failed"), "refusals are logged: {log}");

    // The export open only to another client: a valid certificate is still refused.
    let args: Vec<&str> = tls.iter().copied().chain(["--tls-peer", "client2.test"]).collect();
    let served = Served::start(d, "r5", &args, &members);
    let with = |dir: &str| tls_uri(&served, "r5", &format!("tls-certificates={}", creds.join(dir).display()));
    let refused = assert_fails(Command::new("nbdinfo").arg(with("pki")), "export open to client2 only");
    assert!(refused.contains("opt_go"), "{refused}");
    served.stop();
}

#[test]
fn psk_interoperates_with_gnutls_clients() {
    require_tool("nbdinfo", "libnbd-bin");
    require_tool("nbdcopy", "libnbd-bin");
    require_tool("qemu-io", "qemu-utils");
    let dir = tempdir();
    let d = dir.path();
    let creds = make_pki(d);
    let members = raid5(d);
    let keys = creds.join("keys.psk");
    let served = Served::start(d, "r5", &["--tls", "require", "--tls-psk", keys.to_str().unwrap()], &members);
    let uri = |file: &Path| format!("nbds://alice@localhost:{}/r5?tls-psk-file={}", served.port, file.display());

    let info = run_ok(Command::new("nbdinfo").arg(uri(&keys)));
    assert!(info.contains("with TLS"), "{info}");
    let payload: Vec<u8> = (0..8u32 << 20).map(|i| (i.wrapping_mul(40503) >> 7) as u8).collect();
    std::fs::write(d.join("payload"), &payload).unwrap();
    run_ok(Command::new("nbdcopy").arg(d.join("payload")).arg(uri(&keys)));
    run_ok(Command::new("nbdcopy").arg(uri(&keys)).arg(d.join("back")));
    assert_same_bytes(
        &std::fs::read(d.join("back")).unwrap()[..payload.len()],
        &payload,
        "nbdcopy round trip over PSK",
    );
    // qemu's tls-creds-psk reads DIR/keys.psk.
    let psk = format!("tls-creds-psk,id=tls0,endpoint=client,dir={},username=alice", creds.display());
    run_ok(&mut qemu_io(&served, "r5", &psk, &["write -P 0x77 20M 512K", "read -P 0x77 20M 512K"]));
    run_ok(&mut qemu_img_info(&served, "r5", &psk));
    let py = python_tls(&served, "r5", &format!("h.set_tls_psk_file({:?})\nh.set_tls_username('alice')", keys));
    assert!(py.status.success(), "python: {}", String::from_utf8_lossy(&py.stderr));

    // A wrong key, with each client; plaintext.
    let wrong = creds.join("wrong.psk");
    assert_fails(Command::new("nbdinfo").arg(uri(&wrong)), "nbdinfo with a wrong PSK");
    let wrong_dir = d.join("wrong");
    std::fs::create_dir(&wrong_dir).unwrap();
    std::fs::copy(&wrong, wrong_dir.join("keys.psk")).unwrap();
    let bad = format!("tls-creds-psk,id=tls0,endpoint=client,dir={},username=alice", wrong_dir.display());
    assert_fails(&mut qemu_img_info(&served, "r5", &bad), "qemu-img with a wrong PSK");
    assert_fails(Command::new("nbdinfo").arg(served.uri("r5")), "plaintext against require");
    run_ok(&mut qemu_io(&served, "r5", &psk, &["read -P 0x77 20M 512K"]));
    let log = served.stop();
    assert!(log.contains("TLS handshake failed"), "wrong keys are logged: {log}");
}

#[test]
fn config_keys_offer_tls_and_one_export_requires_it() {
    require_tool("nbdinfo", "libnbd-bin");
    let dir = tempdir();
    let d = dir.path();
    let creds = make_pki(d);
    for (name, prefix) in [("open", "a"), ("locked", "b")] {
        let members: Vec<String> = (0..2).map(|i| format!("{prefix}{i}")).collect();
        let mut args = vec!["create", "--level", "1", "--size", "16M", "--name", name];
        args.extend(members.iter().map(String::as_str));
        assert_ok(&raidnbd(d, &args));
    }
    let config = format!(
        "tls = \"on\"\ntls_certificates = {:?}\n\n[[export]]\nname = \"open\"\nmembers = [\"a0\", \"a1\"]\n\n\
         [[export]]\nname = \"locked\"\nmembers = [\"b0\", \"b1\"]\ntls = \"require\"\n",
        creds.join("pki")
    );
    std::fs::write(d.join("raidnbd.toml"), config).unwrap();
    let served =
        Served::run(d, |listen| ["serve", "--listen", listen, "--config", "raidnbd.toml"].map(String::from).to_vec());
    let tls = |export: &str| tls_uri(&served, export, &format!("tls-certificates={}", creds.join("pki").display()));
    let plain = run_ok(Command::new("nbdinfo").arg(served.uri("open")));
    assert!(plain.contains("without TLS"), "{plain}");
    assert_fails(Command::new("nbdinfo").arg(served.uri("locked")), "plaintext to the export that requires TLS");
    assert!(run_ok(Command::new("nbdinfo").arg(tls("locked"))).contains("with TLS"));
    assert!(run_ok(Command::new("nbdinfo").arg(tls("open"))).contains("with TLS"));
    served.stop();

    // Rules that cannot work are refused at start.
    let bad = raidnbd(d, &["serve", "--tls", "on", "a0", "a1"]);
    assert_user_error(&bad, "--tls-certificates");
    let bad = raidnbd(d, &["serve", "--tls-verify-peer", "a0", "a1"]);
    assert_user_error(&bad, "need --tls on");
    let bad = raidnbd(
        d,
        &[
            "serve",
            "--tls",
            "on",
            "--tls-psk",
            creds.join("keys.psk").to_str().unwrap(),
            "--tls-verify-peer",
            "a0",
            "a1",
        ],
    );
    assert_user_error(&bad, "for certificates");
}

#[test]
fn allow_refuses_other_addresses_at_accept() {
    require_tool("nbdinfo", "libnbd-bin");
    let dir = tempdir();
    let d = dir.path();
    assert_ok(&raidnbd(d, &["create", "--level", "1", "--size", "16M", "a0", "a1"]));
    let served = Served::start(d, "m", &["--allow", "10.0.0.0/8", "--allow", "::1"], &["a0", "a1"]);
    assert_fails(Command::new("nbdinfo").arg(served.uri("m")), "a peer outside --allow");
    let log = served.stop();
    assert!(log.contains("address not allowed") && log.contains("127.0.0.1"), "refusal logged: {log}");
    let served = Served::start(d, "m", &["--allow", "127.0.0.0/8"], &["a0", "a1"]);
    run_ok(Command::new("nbdinfo").arg(served.uri("m")));
    served.stop();
    assert_usage_error(&raidnbd(d, &["serve", "--allow", "10.0.0.0/33", "a0", "a1"]), "prefix length");
}

/// A client that reads its replies slowly still gets all of them: the server's last TLS
/// records, sealed while the socket was full, are flushed with their batch (they once waited
/// for the next reply, and nbdcopy over TLS hung under load). Whether the records are left
/// behind depends on timing; `reply_writer`'s unit test pins the flush itself.
#[test]
fn replies_reach_a_slow_reader_whole() {
    require_tool("qemu-io", "qemu-utils");
    let dir = tempdir();
    let d = dir.path();
    let (creds, served) = x509_raid5(d);
    let pki = creds.join("pki");
    let x509 = format!("tls-creds-x509,id=tls0,endpoint=client,dir={}", pki.display());
    run_ok(&mut qemu_io(&served, "r5", &x509, &["write -P 0x5a 0 24M"]));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/slow_tls_reader.py");
    for _ in 0..3 {
        let out = output(
            Command::new(PYTHON)
                .arg(&script)
                .args([&served.port.to_string(), "r5", pki.join("ca-cert.pem").to_str().unwrap()])
                .args([&(24u32 << 20).to_string(), "90"]),
        );
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "slow TLS reader: {text}");
    }
    served.stop();
}
