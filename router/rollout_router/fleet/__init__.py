"""Many routers, one policy: session ownership, fleet-wide load and pin handoff (docs/fleet.md).

One module per job: ``ownership`` (rendezvous hashing and recent member sets;
pure), ``membership`` (candidate peers and live members; pure), ``peerpods``
(the router pods of a resource, from the pod watch), ``client`` (calls to
peers' admin listeners), ``loadview`` (other routers' or vLLM's counts into the
replica set), ``handoff`` (pins follow ownership), ``release``
(a pin dropped at every router) and ``node`` (``Fleet``: one
router's part, tying them together). The fleet decides; the listeners send and
answer: forwarding to the owner lives under ``proxy/`` (``owner.py``, and one
module per protocol), and so do the admin routes between routers
(``proxy/fleet_routes.py``). Nothing here imports from ``proxy/``.
"""
