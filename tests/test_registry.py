"""The policy registry is the one list of policy names: settings, CLI, CRD and docs follow it."""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from rollout_router import serve
from rollout_router.policy import LiveConfig, PolicyOptions, registry
from rollout_router.policy.cost_affinity import CostAffinityOptions
from rollout_router.settings import PolicySettings, SettingsError, parse_settings
from rollout_router_operator.crd import crd_manifest

ROOT = Path(__file__).resolve().parents[1]
RESEARCH = sorted(set(registry.POLICIES) - set(registry.SELECTABLE))


def test_the_selectable_policies_are_todays_six():
    """Which policies a router may run is a decision (the registry's flag), not a side effect of adding one."""
    assert registry.SELECTABLE == ("affinity", "cost_affinity", "least_loaded", "round_robin", "consistent_hash",
                                   "power_of_two")
    assert RESEARCH == ["affinity_adaptive", "cache_aware", "dual_threshold"]


@pytest.mark.parametrize("name", registry.SELECTABLE)
def test_the_settings_take_every_selectable_policy(name):
    assert parse_settings({"policy": name, "affinityBreakMargin": 2}).policy == name


@pytest.mark.parametrize("name, why", [*((name, "is research-only") for name in RESEARCH),
                                       ("fastest", "is not a policy"), (3, "is not a policy")])
def test_other_names_are_refused_naming_the_key_and_the_choices(name, why):
    with pytest.raises(SettingsError) as error:
        parse_settings({"policy": name})
    assert str(error.value).startswith("policy: ") and why in str(error.value)
    assert "choose one of: " + ", ".join(registry.SELECTABLE) in str(error.value)


def test_the_crd_enum_is_the_registrys():
    schema = crd_manifest()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert schema["properties"]["policy"]["enum"] == list(registry.SELECTABLE)


def test_the_cli_help_names_the_selectable_policies_only():
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    (policy,) = [action for action in parser._actions if "--policy" in action.option_strings]
    assert all(name in policy.help for name in registry.SELECTABLE)
    assert not any(name in policy.help for name in RESEARCH)


def test_the_docs_list_the_selectable_policies():
    """docs/operator.md's `policy` row is the registry's summary; rewrite it from ``registry.summary`` if this fails."""
    assert registry.summary(lambda name: f"`{name}`") in (ROOT / "docs" / "operator.md").read_text()


@pytest.mark.parametrize("name", registry.SELECTABLE)
def test_a_policy_with_options_has_them_in_the_settings_under_its_name(name):
    """A policy's own options model is the settings field named after it, handed to it and to no other policy."""
    model = registry.POLICIES[name].Options
    settings = parse_settings({"policy": name, "affinityBreakMargin": 2})
    if model is None:
        assert name not in PolicySettings.model_fields and settings.live_config().options is None
    else:
        assert PolicySettings.model_fields[name].annotation is model
        assert settings.live_config().options == model()


def test_cost_affinity_options_keep_their_keys():
    settings = parse_settings({"policy": "cost_affinity", "affinityBreakMargin": 2,
                               "costAffinity": {"relative": 0.5, "minTurnSeconds": None}})
    assert settings.live_config().options == CostAffinityOptions(relative=0.5, min_turn_seconds=None)
    assert settings.dump()["costAffinity"] == {"relative": 0.5, "minTurnSeconds": None}


def test_another_policys_options_are_refused():
    with pytest.raises(TypeError, match="PolicyOptions given where CostAffinityOptions is wanted"):
        registry.create("cost_affinity").configure(LiveConfig(margin=2, options=PolicyOptions()))
