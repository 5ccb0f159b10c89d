"""Draw-and-Discard test helpers: a ledger with principals, a server on 127.0.0.1."""
import dataclasses

from sage_tfx.dnd import ClientConfig, GLMSpec
from sage_tfx.ledger import BlockSpec, open_ledger

from live_http import serving  # noqa: F401 - the D&D tests' server, re-exported

STREAM = "clients"
GRANULARITY = "hash:client_id:4:dnd"
TINY_SPEC = GLMSpec("logistic", 2)  # 3 weights
TINY_CFG = ClientConfig(gamma=0.1, l1_norm_clip=1.0, epsilon=1.0)


@dataclasses.dataclass
class Principals:
    """Tokens of a ledger's principals: admin, the server (pipeline + auditor, bound to the
    stream), a model reader (pipeline), an auditor and clients by name."""

    url: str
    admin: str
    server: str
    pipeline: str
    auditor: str
    clients: dict

    def client(self, name: str) -> str:
        return self.clients[name]


def make_ledger(url: str, *, clients=("alice", "bob"), epsilon_g: float = 2000.0,
                granularity: str = GRANULARITY, blocks=None, mode: str = "basic") -> Principals:
    """A stream of hash-bucket blocks and principals (authentication on)."""
    with open_ledger(url) as led:
        led.create_stream(STREAM, epsilon_g=epsilon_g, delta_g=1e-6, granularity=granularity,
                          mode=mode)
        led.add_blocks(STREAM, [BlockSpec(b, f"/b/{b}") for b in
                                (blocks or [f"bucket-{i}" for i in range(4)])])
        admin = led.add_principal("root", ["admin"])
    with open_ledger(url, token=admin) as led:
        server = led.add_principal("dnd-server", ["pipeline", "auditor"])
        led.bind("dnd-server", STREAM, "default")
        pipeline = led.add_principal("model-reader", ["pipeline"])
        led.bind("model-reader", STREAM, "default")
        auditor = led.add_principal("auditor", ["auditor"])
        tokens = {c: led.add_principal(c, ["client"]) for c in clients}
    return Principals(url, admin, server, pipeline, auditor, tokens)


def bearer(token: str) -> dict:
    return {"authorization": f"Bearer {token}"}


def tiny_served(p: Principals):
    """(principals, service, app) of a 3-weight run (k = 5, 1000 passes): small enough for a
    fuzzer to generate valid updates."""
    from sage_tfx import services
    from sage_tfx.dnd.server import build_service, create_app
    from sage_tfx.streams import HashBucketScheme
    service = build_service(ledger_url=p.url, stream=STREAM, run_id="r1", spec=TINY_SPEC,
                            config=TINY_CFG, k=5, passes=1000, window_last=4, token=p.server,
                            block_scheme=HashBucketScheme("client_id", 4, "dnd"))
    return p, service, create_app(service, services.Authenticator(p.url, token=p.server))
