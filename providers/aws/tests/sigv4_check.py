"""Checks the Signature Version 4 of HTTP requests as moto does when it enforces
authentication: botocore's SigV4Auth recomputes the signature over the headers the request
says it signed, at the time it says it was signed.

Input on stdin (JSON): {"access_key": ..., "secret_key": ..., "session_token": ... or null,
"region": ..., "service": ..., "requests": [raw HTTP/1.1 request text, ...]}.
Prints one line per request ("ok" or what differs) and exits 1 when any differs.
"""

import json
import sys

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials


def between(text, first, second):
    return text.partition(first)[2].partition(second)[0]


def check(raw, credentials, service, region):
    head, _, body = raw.partition("\r\n\r\n")
    lines = head.split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    authorization = headers.get("authorization", "")
    if not authorization.startswith("AWS4-HMAC-SHA256 "):
        return "no SigV4 Authorization header: %r" % authorization
    scope = between(authorization, "Credential=", ",").split("/")
    if scope[0] != credentials.access_key or scope[2:] != [region, service, "aws4_request"]:
        return "credential scope %r" % scope
    if credentials.token and headers.get("x-amz-security-token") != credentials.token:
        return "no session token header"
    signed = between(authorization, "SignedHeaders=", ",").split(";")
    for required in ("host", "x-amz-date", "content-type"):
        if required not in signed:
            return "%s is not signed: %r" % (required, signed)
    request = AWSRequest(
        method=method,
        url="http://" + headers["host"] + path,
        data=body.encode(),
        headers={k: v for k, v in headers.items() if k in signed},
    )
    request.context["timestamp"] = headers["x-amz-date"]
    auth = SigV4Auth(credentials, service, region)
    canonical = auth.canonical_request(request)
    expected = auth.signature(auth.string_to_sign(request, canonical), request)
    got = authorization.partition("Signature=")[2].strip()
    if got != expected:
        return "signature %s, botocore computes %s over\n%s" % (got, expected, canonical)
    return "ok"


def main():
    spec = json.load(sys.stdin)
    credentials = Credentials(spec["access_key"], spec["secret_key"], spec.get("session_token"))
    results = [
        check(raw, credentials, spec["service"], spec["region"]) for raw in spec["requests"]
    ]
    for r in results:
        print(r)
    sys.exit(0 if results and all(r == "ok" for r in results) else 1)


main()
