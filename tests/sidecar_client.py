#!/usr/bin/python3
# SPDX-License-Identifier: MIT
# A real gRPC client of allot-agentd that nobody on this project wrote:
# Python's grpcio, with stubs generated at run time by grpc_tools.protoc
# from sidecar/proto (upstream's packages and field numbers). Run with
# Debian's /usr/bin/python3, whose modules python3-grpcio and
# python3-grpc-tools are. Prints one JSON object; tests/test_sidecar.c
# checks it.
#   burst TARGET N IDENTITY     N concurrent calls, one descriptor each
#   call TARGET JSON            one call; JSON is the request, as a dict
#   paced TARGET SECONDS KEY VALUE  one descriptor, back to back
#   values TARGET N KEY [FIRST] N distinct values of entry KEY (from
#                               value-FIRST), 16 descriptors a call
#   load TARGET SECONDS CA      TLS: calls on one channel and on a new
#                               channel every 100 ms, for SECONDS
import atexit
import json
import os
import shutil
import sys
import tempfile
import time

import grpc
import grpc_tools
from grpc_tools import protoc

SRC = os.environ.get('ALLOT_SOURCE_DIR',
                     os.path.join(os.path.dirname(__file__), '..'))
PROTO = os.path.join(SRC, 'sidecar', 'proto')
RLS = 'envoy/service/ratelimit/v3/rls.proto'


def stubs():
    out = tempfile.mkdtemp(prefix='allot-rls-py-')
    atexit.register(shutil.rmtree, out, True)
    wkt = os.path.join(os.path.dirname(grpc_tools.__file__), '_proto')
    files = [RLS, 'envoy/extensions/common/ratelimit/v3/ratelimit.proto',
             'envoy/type/v3/ratelimit_unit.proto',
             'envoy/config/core/v3/base.proto']
    rc = protoc.main(['protoc', '-I' + PROTO, '-I' + wkt,
                      '--python_out=' + out, '--grpc_python_out=' + out]
                     + files)
    if rc != 0:
        sys.exit('protoc failed')
    sys.path.insert(0, out)
    from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
    return rls_pb2, rls_pb2_grpc


pb, pbg = stubs()
# Loopback only: never through a proxy the environment may name.
NOPROXY = [('grpc.enable_http_proxy', 0)]
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2  # noqa


def request(spec):
    req = pb.RateLimitRequest(domain=spec.get('domain', 'allot'),
                              hits_addend=spec.get('hits_addend', 0))
    for d in spec['descriptors']:
        desc = req.descriptors.add()
        for k, v in d.get('entries', []):
            desc.entries.add(key=k, value=v)
        if 'pad' in d:
            desc.entries.add(key='pad', value='x' * d['pad'])
        if 'hits_addend' in d:
            desc.hits_addend.value = d['hits_addend']
        if 'limit' in d:
            desc.limit.requests_per_unit = d['limit'][0]
            desc.limit.unit = pb.RateLimitResponse.RateLimit.Unit.Value(
                d['limit'][1])
    return req


def summary(resp):
    return {
        'overall': pb.RateLimitResponse.Code.Name(resp.overall_code),
        'statuses': [{
            'code': pb.RateLimitResponse.Code.Name(s.code),
            'requests_per_unit': s.current_limit.requests_per_unit,
            'unit': pb.RateLimitResponse.RateLimit.Unit.Name(
                s.current_limit.unit),
            'remaining': s.limit_remaining,
            'reset_ms': s.duration_until_reset.seconds * 1000
            + s.duration_until_reset.nanos // 1000000,
        } for s in resp.statuses],
        'headers': {h.key: h.value for h in resp.response_headers_to_add},
    }


def burst(target, n, identity):
    ch = grpc.insecure_channel(target, options=NOPROXY)
    stub = pbg.RateLimitServiceStub(ch)
    req = request({'descriptors': [{'entries': [('caller', identity),
                                                ('endpoint', '/lookup')]}]})
    futs = [stub.ShouldRateLimit.future(req, timeout=10) for _ in range(n)]
    res = [summary(f.result()) for f in futs]
    out = {'ok': sum(r['overall'] == 'OK' for r in res),
           'over': sum(r['overall'] == 'OVER_LIMIT' for r in res),
           'first': res[0],
           'denied': next((r for r in res if r['overall'] != 'OK'), None)}
    ch.close()
    return out


def values(target, n, key, first):
    """n distinct values of entry `key` (value-FIRST, ...), 16
    descriptors a call, one channel: how many descriptors were OK and
    OVER_LIMIT."""
    ch = grpc.insecure_channel(target, options=NOPROXY)
    stub = pbg.RateLimitServiceStub(ch)
    ok = over = calls = 0
    for j in range(0, n, 16):
        req = request({'descriptors': [
            {'entries': [(key, 'value-%d' % (first + i))]}
            for i in range(j, min(n, j + 16))]})
        resp = stub.ShouldRateLimit(req, timeout=10)
        calls += 1
        for st in resp.statuses:
            if st.code == pb.RateLimitResponse.OK:
                ok += 1
            else:
                over += 1
    ch.close()
    return {'calls': calls, 'ok': ok, 'over': over}


def paced(target, seconds, key, value):
    """One descriptor {key: value}, called back to back on one channel
    for `seconds`: how many were OK and OVER_LIMIT, and when the calls
    started and ended (Unix seconds)."""
    ch = grpc.insecure_channel(target, options=NOPROXY)
    stub = pbg.RateLimitServiceStub(ch)
    req = request({'descriptors': [{'entries': [(key, value)]}]})
    grpc.channel_ready_future(ch).result(timeout=10)
    ok = over = 0
    start = time.time()
    while time.time() - start < seconds:
        resp = stub.ShouldRateLimit(req, timeout=10)
        if resp.overall_code == pb.RateLimitResponse.OK:
            ok += 1
        else:
            over += 1
    end = time.time()
    ch.close()
    return {'ok': ok, 'over': over, 'start': start, 'end': end}


def call(target, spec):
    ch = grpc.insecure_channel(
        target, options=NOPROXY + [('grpc.max_send_message_length',
                                    1 << 26)])
    stub = pbg.RateLimitServiceStub(ch)
    try:
        return {'status': 'OK',
                'response': summary(stub.ShouldRateLimit(request(spec),
                                                         timeout=10))}
    except grpc.RpcError as e:
        return {'status': e.code().name, 'message': e.details()}
    finally:
        ch.close()


def load(target, seconds, ca):
    creds = grpc.ssl_channel_credentials(open(ca, 'rb').read())
    opts = NOPROXY
    req = request({'descriptors': [{'entries': [('caller', 'load')]}]})
    long_ch = grpc.secure_channel(target, creds, opts)
    stub = pbg.RateLimitServiceStub(long_ch)
    calls = failures = channels = 0
    errors = []
    end = time.monotonic() + seconds
    next_new = 0
    while time.monotonic() < end:
        try:
            stub.ShouldRateLimit(req, timeout=5)
            calls += 1
        except grpc.RpcError as e:
            failures += 1
            errors.append(e.code().name + ': ' + str(e.details()))
        if time.monotonic() >= next_new:
            ch = grpc.secure_channel(target, creds, opts)
            try:
                pbg.RateLimitServiceStub(ch).ShouldRateLimit(req, timeout=5)
                channels += 1
            except grpc.RpcError as e:
                failures += 1
                errors.append('new: ' + e.code().name + ': '
                              + str(e.details()))
            ch.close()
            next_new = time.monotonic() + 0.1
    long_ch.close()
    return {'calls': calls, 'new_channels': channels, 'failures': failures,
            'errors': errors[:5]}


def main(argv):
    if argv[1] == 'burst':
        out = burst(argv[2], int(argv[3]), argv[4])
    elif argv[1] == 'values':
        out = values(argv[2], int(argv[3]), argv[4],
                     int(argv[5]) if len(argv) > 5 else 0)
    elif argv[1] == 'paced':
        out = paced(argv[2], float(argv[3]), argv[4], argv[5])
    elif argv[1] == 'call':
        out = call(argv[2], json.loads(argv[3]))
    elif argv[1] == 'load':
        out = load(argv[2], float(argv[3]), argv[4])
    else:
        sys.exit('unknown mode ' + argv[1])
    print(json.dumps(out))


if __name__ == '__main__':
    main(sys.argv)
