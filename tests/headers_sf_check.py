#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Every RateLimit-Policy and RateLimit field allot writes parses as an
RFC 9651 structured field with a parser its authors did not write (npm's
structured-headers, tests/sf/sf_check.mjs), and names its policy as it
should read: the example service (liballot's allot_fmt_*, real HTTP
response headers) names the quota charged, allot-agentd's JSON API
names the endpoint class. The callers are named by signed tokens
(HS256, a JWKS file), so that identities with quotes, backslashes,
semicolons and commas, up to the longest a quota may have (255 bytes),
reach both; the sidecar's endpoint classes carry the same characters, up
to their longest (63 bytes). Each is asked until it denies, so that
both fields are read from admitted and denied requests. A hand-broken
field must fail the parser (the check can fail)."""
import base64
import hashlib
import hmac
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from checks import check, failures, free_port

build = os.environ["ALLOT_BUILD_DIR"]
here = os.path.dirname(os.path.abspath(__file__))
sf = os.path.join(here, "sf")

if shutil.which("node") is None or not os.path.isdir(
        os.path.join(sf, "node_modules", "structured-headers")):
    print("headers_sf_check: needs node and tests/sf/node_modules "
          "(scripts/bootstrap: npm ci --prefix tests/sf)")
    sys.exit(77)

ISS, AUD, KID = "https://issuer.test", "sf", "k1"
SECRET = bytes(range(64))
TEAM = 'team "a"\\x'
PUNCT = "semi;colon=1, comma"
LONG = ('"' * 120 + "\\" * 120 + "x" * 15)  # 255 bytes, 240 escaped
EPQ = '"' * 120 + "\\" * 120 + "y" * 7  # 247: "EPQ /lookup" is 255
EP63 = '"' * 31 + "\\" * 31 + "e"  # the longest endpoint class


def yq(s):
    return "'" + s.replace("'", "''") + "'"


QUOTAS = """quotas:
  default:
    tokens_per_second: 1
    burst: 2
    shared: true
  callers:
    - identity: %s
      tokens_per_second: 1
      burst: 2
      endpoints:
        "/lookup":
          tokens_per_second: 1
          burst: 1
    - identity: %s
      tokens_per_second: 1
      burst: 3
    - identity: %s
      tokens_per_second: 1
      burst: 2
    - identity: %s
      tokens_per_second: 1
      burst: 2
      endpoints:
        "/lookup":
          tokens_per_second: 1
          burst: 1
  endpoint_weights:
    default: 1
    "/lookup": 1
    "/export": 1
    %s: 1
""" % (yq(TEAM), yq(PUNCT), yq(LONG), yq(EPQ), yq(EP63))


def b64(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def token(sub):
    now = int(time.time())
    head = b64(json.dumps({"alg": "HS256", "typ": "JWT",
                           "kid": KID}).encode())
    body = b64(json.dumps({"iss": ISS, "sub": sub, "aud": AUD,
                           "iat": now, "exp": now + 600}).encode())
    sig = hmac.new(SECRET, (head + "." + body).encode(),
                   hashlib.sha256).digest()
    return head + "." + body + "." + b64(sig)


def wait_port(port, proc, seconds=10):
    t = time.monotonic() + seconds
    while time.monotonic() < t and proc.poll() is None:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            c.request("GET", "/healthz")
            c.getresponse().read()
            return True
        except OSError:
            time.sleep(0.05)
    return False


work = tempfile.mkdtemp(prefix="allot-sf-")
qfile = os.path.join(work, "quotas.yaml")
with open(qfile, "w") as f:
    f.write(QUOTAS)
jwks = os.path.join(work, "jwks.json")
with open(jwks, "w") as f:
    json.dump({"keys": [{"kty": "oct", "kid": KID, "alg": "HS256",
                         "k": b64(SECRET)}]}, f)
jwt_opts = ["--jwt-issuer", ISS, "--jwks", jwks, "--jwt-audience", AUD]

records = []  # what sf_check.mjs reads
procs = []
try:
    # The example service: liballot in-process, the headers on the wire.
    sp = free_port()
    svc = subprocess.Popen(
        [os.path.join(build, "examples", "allot-example-service"),
         "--config", qfile, "--plain-http", "--listen",
         "127.0.0.1:%d" % sp] + jwt_opts,
        stdout=subprocess.DEVNULL, stderr=open(
            os.path.join(work, "service.log"), "w"))
    procs.append(svc)
    check(wait_port(sp, svc), "the example service answers")
    cases = [(TEAM, "/lookup", TEAM + " /lookup"), (TEAM, "/export", TEAM),
             (PUNCT, "/lookup", PUNCT), (LONG, "/lookup", LONG),
             (EPQ, "/lookup", EPQ + " /lookup"), (EPQ, "/export", EPQ)]
    for sub, path, name in cases:
        statuses = set()
        for _ in range(4):
            c = http.client.HTTPConnection("127.0.0.1", sp, timeout=5)
            try:
                c.request("GET", path + ("?rows=1" if path == "/export"
                                         else ""),
                          headers={"Authorization": "Bearer " + token(sub)})
                r = c.getresponse()
                r.read()
            except (OSError, http.client.HTTPException) as e:
                check(False, "example %s: a %d-byte caller gets an answer "
                      "(%s)" % (path, len(sub), e))
                continue
            statuses.add(r.status)
            for field in ("RateLimit-Policy", "RateLimit"):
                v = r.getheader(field)
                if v is None:
                    check(False, "example %s %d: has %s" % (
                        path, r.status, field))
                    continue
                records.append({"field": field, "value": v, "name": name,
                                "where": "example %s %d (%d-byte name)" % (
                                    path, r.status, len(name))})
        check(statuses == {200, 429}, "example: a %d-byte caller on %s is "
              "admitted, then denied (%s)" % (len(sub), path,
                                              sorted(statuses)))

    # allot-agentd's JSON API: the policy is the endpoint class.
    hp = free_port()
    agentd = subprocess.Popen(
        [os.path.join(build, "sidecar", "allot-agentd"), "--config", qfile,
         "--grpc-listen", "none", "--http-listen", "127.0.0.1:%d" % hp] +
        jwt_opts, stdout=subprocess.DEVNULL,
        stderr=open(os.path.join(work, "agentd.log"), "w"))
    procs.append(agentd)
    check(wait_port(hp, agentd), "allot-agentd answers")
    acases = [(TEAM, "/lookup", "/lookup"), (PUNCT, EP63, EP63),
              (LONG, "", "default"), (EPQ, 'a "b"\\;c=1, d', 'a "b"\\;c=1, d')]
    for sub, ep, name in acases:
        allowed = set()
        for _ in range(4):
            body = {"token": token(sub), "endpoint": ep} if ep else \
                {"token": token(sub)}
            c = http.client.HTTPConnection("127.0.0.1", hp, timeout=5)
            c.request("POST", "/v1/acquire", body=json.dumps(body),
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            d = json.loads(r.read() or b"{}")
            allowed.add(d.get("allowed"))
            for field in ("RateLimit-Policy", "RateLimit"):
                v = d.get("headers", {}).get(field)
                if v is None:
                    check(False, "agentd %r %d: has %s" % (ep, r.status,
                                                          field))
                    continue
                records.append({"field": field, "value": v, "name": name,
                                "where": "agentd endpoint %d bytes %s" % (
                                    len(ep), d.get("allowed"))})
        check(allowed == {True, False}, "agentd: a %d-byte endpoint is "
              "admitted, then denied" % len(ep))
finally:
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(timeout=10)

lines = "".join(json.dumps(r) + "\n" for r in records)
run = subprocess.run(["node", os.path.join(sf, "sf_check.mjs")],
                     input=lines, capture_output=True, text=True, cwd=sf)
print(run.stdout.strip())
check(run.returncode == 0 and len(records) >= 80,
      "structured-headers parses all %d fields as named" % len(records))

# The check can fail: a name written unescaped is refused.
broken = json.dumps({"field": "RateLimit", "value": '"%s";r=0;t=1' % TEAM,
                     "name": TEAM, "where": "unescaped on purpose"})
run = subprocess.run(["node", os.path.join(sf, "sf_check.mjs")],
                     input=broken + "\n", capture_output=True, text=True,
                     cwd=sf)
check(run.returncode == 1 and "FAIL" in run.stdout,
      "an unescaped name fails it: %s" % run.stdout.strip()[:120])

if failures:
    print("kept for inspection: %s" % work)
else:
    shutil.rmtree(work, ignore_errors=True)
sys.exit(1 if failures else 0)
