"""moto's server, with EC2 behaving as real EC2 does where the AWS driver tests need it.

moto is strongly consistent and forgiving where real EC2 is not. This script serves exactly
what `python3 -m moto.server` serves (all services, `/moto-api/...`, threaded) and patches a
few EC2 internals (moto 5.2.x) so that:

1. RunInstances is idempotent by ClientToken (always on).
2. DescribeInstances is eventually consistent: it does not show an instance for
   `--hide-seconds` after its launch (off when 0).
3. ModifyInstanceAttribute SourceDestCheck is refused on an instance with more than one
   network interface (always on).
4. The RunInstances answer is held `--run-instances-delay-ms` after the launch (off when 0).
5. Inspection endpoints for tests (not EC2): `GET /_ec2/instances` (every instance, never
   hidden), `GET /_ec2/stats` (counters); `POST /moto-api/reset` also clears this state.

With `--tls-host`, `--tls-port`, `--tls-cert` and `--tls-key` the same server (one state) also
listens with TLS there: for a client that must reach EC2 over HTTPS, as a cloud provider's
container does.

Usage:
    python3 ec2_moto.py -H 127.0.0.1 -p PORT [--hide-seconds S] [--run-instances-delay-ms D]
        [--tls-host H --tls-port P --tls-cert CERT.pem --tls-key KEY.pem]

Needs `pip install 'moto[server]'` (stdlib + moto + werkzeug only).
"""

import argparse
import json
import os
import signal
import sys
import threading
import time

from werkzeug.serving import make_server, run_simple

from moto.core.responses import ActionResult
from moto.ec2.exceptions import EC2ClientError, InvalidInstanceIdError
from moto.ec2.models import ec2_backends
from moto.ec2.models.instances import InstanceBackend
from moto.ec2.responses.instances import InstanceResponse
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

HIDE_SECONDS = 0.0  # set from --hide-seconds
RUN_INSTANCES_DELAY = 0.0  # seconds, set from --run-instances-delay-ms


class State:
    """The wrapper's own state; cleared by `POST /moto-api/reset`."""

    def __init__(self):
        self.lock = threading.Lock()  # guards the fields below
        self.run_lock = threading.Lock()  # serializes token check + launch of RunInstances
        self.clear()

    def clear(self):
        with self.lock:
            # (account, region, token) -> (request params without ClientToken, Reservation)
            self.tokens = {}
            self.token_of = {}  # instance id -> client token
            self.launched_at = {}  # instance id -> time.monotonic() at launch
            self.stats = dict.fromkeys(
                [
                    "run_instances_calls",
                    "instances_launched",
                    "idempotent_replays",
                    "hidden_describe_misses",
                ],
                0,
            )

    def count(self, name, n=1):
        with self.lock:
            self.stats[name] += n


STATE = State()


def hidden(instance_id):
    if HIDE_SECONDS <= 0:
        return False
    with STATE.lock:
        launched = STATE.launched_at.get(instance_id)
    return launched is not None and time.monotonic() - launched < HIDE_SECONDS


# --- Launch bookkeeping: InstanceBackend.run_instances ------------------------------------
# Records the wrapper's own launch time of each instance (for behaviour 2).
_orig_backend_run_instances = InstanceBackend.run_instances


def backend_run_instances(self, *args, **kwargs):
    reservation = _orig_backend_run_instances(self, *args, **kwargs)
    now = time.monotonic()
    with STATE.lock:
        for instance in reservation.instances:
            STATE.launched_at[instance.id] = now
        STATE.stats["instances_launched"] += len(reservation.instances)
    return reservation


InstanceBackend.run_instances = backend_run_instances


# --- 1 + 4. RunInstances: InstanceResponse.run_instances -----------------------------------
# EC2 (docs "Ensuring idempotency in Amazon EC2 API requests"): a RunInstances retried with
# the same ClientToken and the same parameters returns the original reservation (even if its
# instances are terminated since) and launches nothing; the same token with other parameters
# fails with IdempotentParameterMismatch. Tokens live at least an hour; we keep them for the
# process lifetime (per account and region, as EC2 does).
# Behaviour 4 (a late answer, as after a network hiccup): the instances exist at once, the
# answer is held for --run-instances-delay-ms; a replay is answered at once.
class IdempotentParameterMismatch(EC2ClientError):
    def __init__(self):
        super().__init__(
            "IdempotentParameterMismatch",
            "Arguments on this idempotent request are inconsistent with arguments used in"
            " previous request(s).",
        )


_orig_run_instances = InstanceResponse.run_instances


def run_instances(self):
    STATE.count("run_instances_calls")
    token = self._get_param("ClientToken")
    if not token or self._get_bool_param("DryRun"):
        result = _orig_run_instances(self)
    else:
        key = (self.current_account, self.region, token)
        params = {k: v for k, v in self.querystring.items() if k != "ClientToken"}
        with STATE.run_lock:
            with STATE.lock:
                known = STATE.tokens.get(key)
            if known is not None:
                known_params, reservation = known
                if known_params != params:
                    raise IdempotentParameterMismatch()
                STATE.count("idempotent_replays")
                return ActionResult(reservation)
            result = _orig_run_instances(self)
            reservation = result.result
            with STATE.lock:
                STATE.tokens[key] = (params, reservation)
                for instance in reservation.instances:
                    STATE.token_of[instance.id] = token
    if RUN_INSTANCES_DELAY > 0:
        time.sleep(RUN_INSTANCES_DELAY)
    return result


InstanceResponse.run_instances = run_instances


# --- 2. DescribeInstances lag: InstanceBackend.describe_instances and
#        InstanceBackend.get_reservations_by_instance_ids --------------------------------
# EC2 (docs "Eventual consistency in the Amazon EC2 API"): right after RunInstances, a
# DescribeInstances may not show the new instance: asked by id it fails with
# InvalidInstanceID.NotFound, with filters it leaves the instance out.
# In moto 5.2.1 only the DescribeInstances handler calls these two backend functions
# (terminate, tags, network interfaces use all_reservations/get_instance, left alone), and
# all_reservations hands out copies of the reservations, so narrowing `instances` is safe.
_orig_describe_instances = InstanceBackend.describe_instances
_orig_get_reservations_by_instance_ids = InstanceBackend.get_reservations_by_instance_ids


def describe_instances(self, filters=None):
    shown = []
    for reservation in _orig_describe_instances(self, filters):
        visible = [i for i in reservation.instances if not hidden(i.id)]
        if len(visible) < len(reservation.instances):
            STATE.count("hidden_describe_misses", len(reservation.instances) - len(visible))
        if visible:
            reservation.instances = visible  # a copy of moto's reservation
            shown.append(reservation)
    return shown


def get_reservations_by_instance_ids(self, instance_ids, filters=None):
    missing = [i for i in instance_ids if hidden(i)]
    if missing:
        STATE.count("hidden_describe_misses", len(missing))
        raise InvalidInstanceIdError(missing[0] if len(missing) == 1 else missing)
    return _orig_get_reservations_by_instance_ids(self, instance_ids, filters)


InstanceBackend.describe_instances = describe_instances
InstanceBackend.get_reservations_by_instance_ids = get_reservations_by_instance_ids


# --- 3. ModifyInstanceAttribute SourceDestCheck: InstanceResponse.modify_instance_attribute
# EC2 refuses sourceDestCheck on an instance with several network interfaces (the check is a
# per-interface attribute then; ModifyNetworkInterfaceAttribute stays allowed).
_orig_modify_instance_attribute = InstanceResponse.modify_instance_attribute


def modify_instance_attribute(self):
    if (
        self._get_param("SourceDestCheck.Value") is not None
        or self._get_param("Attribute") == "sourceDestCheck"
    ):
        instance_id = self._get_param("InstanceId")
        if len(self.ec2_backend.get_instance(instance_id).nics) > 1:
            raise EC2ClientError(
                "InvalidInstanceID",
                f"There are multiple interfaces attached to instance '{instance_id}'."
                " Please specify an interface ID for the operation instead.",
            )
    return _orig_modify_instance_attribute(self)


InstanceResponse.modify_instance_attribute = modify_instance_attribute


# --- 5. Inspection endpoints (for tests; not EC2) -----------------------------------------
def all_instances():
    with STATE.lock:
        token_of = dict(STATE.token_of)
    out = []
    for account in list(ec2_backends.values()):
        for backend in list(account.values()):
            for reservation in list(backend.reservations.values()):
                for instance in list(reservation.instances):
                    out.append(
                        {
                            "id": instance.id,
                            "state": instance.state,
                            "tags": dict(backend.tags.get(instance.id, {})),
                            "client_token": token_of.get(instance.id),
                        }
                    )
    return out


class Middleware:
    def __init__(self, app):
        self.app = app

    def __call__(self, environ, start_response):
        method = environ.get("REQUEST_METHOD", "GET")
        path = environ.get("PATH_INFO", "")
        if method == "GET" and path == "/_ec2/instances":
            return self.json(start_response, all_instances())
        if method == "GET" and path == "/_ec2/stats":
            with STATE.lock:
                stats = dict(STATE.stats)
            return self.json(start_response, stats)
        if method == "POST" and path.rstrip("/") == "/moto-api/reset":
            STATE.clear()
        return self.app(environ, start_response)

    @staticmethod
    def json(start_response, value):
        body = json.dumps(value).encode()
        start_response(
            "200 OK",
            [("Content-Type", "application/json"), ("Content-Length", str(len(body)))],
        )
        return [body]


def main():
    global HIDE_SECONDS, RUN_INSTANCES_DELAY
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, default=int(os.environ.get("MOTO_PORT", 5000)))
    parser.add_argument("--hide-seconds", type=float, default=0.0)
    parser.add_argument("--run-instances-delay-ms", type=float, default=0.0)
    parser.add_argument("--tls-host")
    parser.add_argument("--tls-port", type=int)
    parser.add_argument("--tls-cert")
    parser.add_argument("--tls-key")
    args = parser.parse_args()
    tls = [args.tls_host, args.tls_port, args.tls_cert, args.tls_key]
    if any(v is not None for v in tls) and not all(v is not None for v in tls):
        parser.error("--tls-host, --tls-port, --tls-cert and --tls-key go together")
    HIDE_SECONDS = args.hide_seconds
    RUN_INSTANCES_DELAY = args.run_instances_delay_ms / 1000.0
    os.environ.setdefault("MOTO_PORT", str(args.port))  # as moto.server does

    def stop(_signum, _frame):
        sys.exit(0)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)

    app = DomainDispatcherApplication(create_backend_app)  # as moto.server builds it
    app.debug = True
    if args.tls_host is not None:
        server = make_server(
            args.tls_host,
            args.tls_port,
            Middleware(app),
            threaded=True,
            ssl_context=(args.tls_cert, args.tls_key),
        )
        threading.Thread(target=server.serve_forever, daemon=True).start()
    run_simple(args.host, args.port, Middleware(app), threaded=True)


if __name__ == "__main__":
    main()
