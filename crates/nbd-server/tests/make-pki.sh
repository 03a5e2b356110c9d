#!/bin/sh
# Makes throw-away TLS credentials for the tests (certtool and psktool from gnutls-bin), valid
# for two days from now, so nothing that expires is ever committed. Layout under DIR:
#   pki/             ca-cert.pem (CA "raidnbd test CA"), server-cert.pem + server-key.pem
#                    (localhost, 127.0.0.1), client-cert.pem + client-key.pem (client1.test):
#                    the directory both the server (--tls-certificates) and the clients
#                    (nbds://...?tls-certificates=, qemu tls-creds-x509 dir=) are given
#   foreign-client/  ca-cert.pem of our CA, but a client certificate from another CA
#   foreign-ca/      only the other CA: a client that trusts it must refuse our server
#   keys.psk         psktool's alice:hexkey; wrong.psk: alice with another key
# Usage: make-pki.sh DIR
set -eu
dir=$1
for tool in certtool psktool; do
  command -v "$tool" >/dev/null || { echo "make-pki.sh: $tool is not installed: apt-get install gnutls-bin" >&2; exit 1; }
done
mkdir -p "$dir/pki" "$dir/foreign-client" "$dir/foreign-ca" "$dir/work"
w=$dir/work
# RSA: qemu 10 requires key encipherment in the usage of a client certificate, which ECDSA
# keys cannot have.
key() { certtool --generate-privkey --key-type=rsa --bits=2048 --outfile "$1" >/dev/null 2>&1; }
ca() { # NAME KEY CERT
  key "$2"
  printf 'cn = %s\nca\ncert_signing_key\nexpiration_days = 2\n' "$1" >"$w/ca.info"
  certtool --generate-self-signed --load-privkey "$2" --template "$w/ca.info" --outfile "$3" >/dev/null 2>&1
}
signed() { # CA_CERT CA_KEY KEY CERT TEMPLATE_LINES
  key "$3"
  printf '%b' "$5" >"$w/cert.info"
  certtool --generate-certificate --load-ca-certificate "$1" --load-ca-privkey "$2" --load-privkey "$3" \
    --template "$w/cert.info" --outfile "$4" >/dev/null 2>&1
}
ca "raidnbd test CA" "$w/ca-key.pem" "$dir/pki/ca-cert.pem"
ca "some other CA" "$w/other-ca-key.pem" "$dir/foreign-ca/ca-cert.pem"
server='cn = localhost\ndns_name = localhost\nip_address = 127.0.0.1\ntls_www_server\nsigning_key\nencryption_key\nexpiration_days = 2\n'
client='cn = client1.test\ndns_name = client1.test\ntls_www_client\nsigning_key\nencryption_key\nexpiration_days = 2\n'
signed "$dir/pki/ca-cert.pem" "$w/ca-key.pem" "$dir/pki/server-key.pem" "$dir/pki/server-cert.pem" "$server"
signed "$dir/pki/ca-cert.pem" "$w/ca-key.pem" "$dir/pki/client-key.pem" "$dir/pki/client-cert.pem" "$client"
cp "$dir/pki/ca-cert.pem" "$dir/foreign-client/ca-cert.pem"
signed "$dir/foreign-ca/ca-cert.pem" "$w/other-ca-key.pem" "$dir/foreign-client/client-key.pem" \
  "$dir/foreign-client/client-cert.pem" "$client"
cp "$dir/foreign-client/client-cert.pem" "$dir/foreign-client/client-key.pem" "$dir/foreign-ca/"
psktool -u alice -p "$dir/keys.psk" >/dev/null 2>&1
psktool -u alice -p "$dir/wrong.psk" >/dev/null 2>&1
rm -rf "$w"
