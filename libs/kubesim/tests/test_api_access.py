"""Reviews, tokens, logs, default ServiceAccounts and namespace termination."""

from __future__ import annotations

import base64
import json
from typing import Any

from flotilla.common.testing import eventually
from flotilla.kubesim.server import KubeSim
from flotilla.kubesim.sim import SimOptions
from flotilla.kubesim.testing import auth_session

from . import builders


async def test_reviews_allow_everything_and_name_the_admin(hub: KubeSim) -> None:
    access = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"verb": "delete", "resource": "nodes"}},
    }
    async with auth_session(hub, base_url=hub.url) as http:
        async with http.post(
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", json=access
        ) as r:
            answer = await r.json()
        assert r.status == 201 and answer["status"]["allowed"] is True
        assert answer["spec"] == access["spec"]
        async with http.post(
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            json={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
        ) as r:
            who = await r.json()
        assert who["status"]["userInfo"]["username"] == "kubesim-admin"
        async with http.get("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews") as r:
            assert r.status == 405
        async with http.get("/apis/authorization.k8s.io/v1") as r:
            resources = {e["name"]: e["verbs"] for e in (await r.json())["resources"]}
        assert resources["selfsubjectaccessreviews"] == ["create"]


async def test_every_namespace_has_a_default_service_account_with_tokens(hub: KubeSim) -> None:
    async with auth_session(hub, base_url=hub.url) as http:
        await http.post("/api/v1/namespaces", json={"metadata": {"name": "team"}})
        async with http.get("/api/v1/namespaces/team/serviceaccounts/default") as r:
            assert r.status == 200
        async with http.post(
            "/api/v1/namespaces/team/serviceaccounts/default/token",
            json={"spec": {"audiences": ["api"], "expirationSeconds": 1200}},
        ) as r:
            token = await r.json()
        assert r.status == 201
        claims = token["status"]["token"].split(".")[1]
        decoded = json.loads(base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4)))
        assert decoded["sub"] == "system:serviceaccount:team:default"
        assert decoded["aud"] == ["api"] and decoded["exp"] - decoded["iat"] == 1200
        async with http.post(
            "/api/v1/namespaces/team/serviceaccounts/default/token",
            json={"spec": {"expirationSeconds": 5}},
        ) as r:
            assert r.status == 422
        async with http.post("/api/v1/namespaces/team/serviceaccounts/nobody/token", json={}) as r:
            assert r.status == 404
        # Deleting the namespace removes what is in it, then the namespace.
        await http.post("/api/v1/namespaces/team/configmaps", json={"metadata": {"name": "c"}})
        async with http.delete("/api/v1/namespaces/team") as r:
            assert r.status == 200
        async with http.get("/api/v1/namespaces/team/serviceaccounts/default") as r:
            assert r.status == 404
        async with http.get("/api/v1/namespaces/team") as r:
            assert r.status == 404


async def test_namespace_is_terminating_while_a_finalizer_holds_its_content(
    hub: KubeSim,
) -> None:
    async with auth_session(hub, base_url=hub.url) as http:
        await http.post("/api/v1/namespaces", json={"metadata": {"name": "held"}})
        held = {"metadata": {"name": "c", "finalizers": ["example.com/hold"]}}
        await http.post("/api/v1/namespaces/held/configmaps", json=held)
        await http.delete("/api/v1/namespaces/held")
        async with http.get("/api/v1/namespaces/held") as r:
            assert (await r.json())["status"]["phase"] == "Terminating"
        async with http.get("/api/v1/namespaces/held/serviceaccounts/default") as r:
            assert r.status == 404
        await http.patch(
            "/api/v1/namespaces/held/configmaps/c",
            data=b'{"metadata":{"finalizers":null}}',
            headers={"Content-Type": "application/merge-patch+json"},
        )
        async with http.get("/api/v1/namespaces/held") as r:
            assert r.status == 404


async def test_pod_logs_are_simulated(kubesim_factory: Any) -> None:
    member: KubeSim = await kubesim_factory("m", sim=SimOptions(nodes=1, pod_ready_seconds=0.05))
    pods = "/api/v1/namespaces/default/pods"
    pod = {"metadata": {"name": "p"}, "spec": builders.deployment()["spec"]["template"]["spec"]}
    async with auth_session(member, base_url=member.url) as http:
        await http.post(pods, json=pod)

        async def running() -> bool:
            async with http.get(f"{pods}/p") as r:
                return bool((await r.json()).get("status", {}).get("phase") == "Running")

        await eventually(running, what="pod p running")
        async with http.get(f"{pods}/p/log") as r:
            text = await r.text()
        assert r.status == 200 and r.content_type == "text/plain"
        assert "container main started" in text
        async with http.get(f"{pods}/p/log?tailLines=1") as r:
            assert (await r.text()).count("\n") == 1
        async with http.get(f"{pods}/p/log?container=other") as r:
            assert r.status == 400
