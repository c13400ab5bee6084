"""The verl plug-in: a text env played through a generate server gives verl the tokens, masks,
turns and reward of our own rollout of the same env and seed; inside a verl environment
(``make verl``), the agent loop is registered and returns that episode as an AgentLoopOutput."""

import asyncio
import importlib.util

import pytest
import torch

from tokenergy.energy import actfocus_weights
from tokenergy.envs import make
from tokenergy.integrations.verl import (
    AGENT_NAME,
    actfocus_advantage_scale,
    actfocus_energy,
    actfocus_settings,
    play_episode,
    response_roles,
    scale_batch_advantages,
    turn_roles,
)
from tokenergy.losses import ppo_policy_loss
from tokenergy.models import build_tokenizer
from tokenergy.rollout import rollout
from tokenergy.rollout.episodes import noisy_solver
from tokenergy.types import Role

HAS_VERL = importlib.util.find_spec("verl") is not None
HAS_TRAINER = HAS_VERL and importlib.util.find_spec("transfer_queue") is not None


def replaying(tok, texts, calls=None):
    """A generate server that writes the given turns in order."""
    turns = iter(texts)

    async def generate(prompt_ids, params):
        if calls is not None:
            calls.append((list(prompt_ids), dict(params)))
        return tok(next(turns), add_special_tokens=False).input_ids, None

    return generate


def ours(tok, env_name, seed, epsilon, max_turns, **env_kwargs):
    import numpy as np

    (ep,) = rollout(
        None, tok, [make(env_name, **env_kwargs)], [seed], max_turns=max_turns,
        max_turn_tokens=64, max_tokens=4096,
        turn_fn=noisy_solver(epsilon, np.random.default_rng(seed)),
    )  # fmt: skip
    return ep


@pytest.mark.parametrize(
    ("env_name", "seed", "epsilon"),
    [("sokoban", 3, 0.0), ("sokoban", 4, 0.5), ("frozenlake", 1, 0.5), ("sudoku4", 2, 0.3)],
)
def test_an_episode_through_a_generate_server_is_our_rollout_of_it(env_name, seed, epsilon):
    tok = build_tokenizer()
    want = ours(tok, env_name, seed, epsilon, max_turns=5)
    calls = []
    got = asyncio.run(
        play_episode(replaying(tok, want.turn_texts, calls), tok, env_name, seed,
                     {"temperature": 1.0}, max_turns=5)
    )  # fmt: skip
    n = len(got.prompt_ids)
    sequence = got.prompt_ids + got.response_ids
    # ours keeps the observation after the last turn (to bootstrap a value); verl needs none
    assert want.tokens[: len(sequence)] == sequence
    assert want.roles[n : len(sequence)] == [
        int(Role.OBSERVATION) if m == 0 else r
        for m, r in zip(got.response_mask, want.roles[n : len(sequence)], strict=True)
    ]
    assert [int(r != int(Role.OBSERVATION)) for r in want.roles[n : len(sequence)]] == (
        got.response_mask
    )
    assert got.reward == pytest.approx(want.episode_return)
    assert (got.turns, got.success) == (want.turns, want.success)
    # the roles read back from the response ids are our rollout's
    assert response_roles(tok, got.response_ids, got.response_mask) == want.roles[n : len(sequence)]
    # every turn asks the server to stop at the end of the answer, and sees the whole context
    assert all(p["stop"] == ["</answer>"] and p["temperature"] == 1.0 for _, p in calls)
    assert [len(c) for c, _ in calls] == sorted(len(c) for c, _ in calls)


def test_the_response_stops_at_its_length():
    tok = build_tokenizer()
    want = ours(tok, "sokoban", 3, 0.5, max_turns=5)
    got = asyncio.run(
        play_episode(replaying(tok, want.turn_texts), tok, "sokoban", 3, {}, max_turns=5,
                     response_length=40)
    )  # fmt: skip
    assert len(got.response_ids) == len(got.response_mask) <= 40
    assert got.truncated or got.turns == want.turns


@pytest.mark.skipif(not HAS_VERL, reason="verl is not installed (make verl)")
def test_the_agent_loop_is_registered_and_returns_the_episode():
    from types import SimpleNamespace

    from hydra.utils import get_class
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    import tokenergy.integrations.verl as plug

    # verl builds the loop from this path (hydra.utils.instantiate)
    assert get_class(_agent_loop_registry[AGENT_NAME]["_target_"]) is plug.TokenergyTextEnvLoop
    tok = build_tokenizer()
    want = ours(tok, "sokoban", 4, 0.5, max_turns=5)
    texts = iter(want.turn_texts)

    class Server:
        async def generate(self, request_id, prompt_ids, sampling_params, **kw):
            ids = tok(next(texts), add_special_tokens=False).input_ids
            # what verl's TokenOutput carries (its module needs the serving stack)
            return SimpleNamespace(token_ids=ids, log_probs=[-0.5] * len(ids))

    loop = object.__new__(plug.TokenergyTextEnvLoop)
    loop.server_manager, loop.tokenizer = Server(), tok
    loop.rollout_config = SimpleNamespace(response_length=1024)
    out = asyncio.run(
        loop.run({"temperature": 1.0}, extra_info={"env": "sokoban", "seed": 4, "max_turns": 5},
                 raw_prompt=[])
    )  # fmt: skip
    assert (
        out.prompt_ids + out.response_ids
        == want.tokens[: len(out.prompt_ids) + len(out.response_ids)]
    )
    assert out.reward_score == pytest.approx(want.episode_return)
    assert out.num_turns == 2 * want.turns
    assert [lp for lp, m in zip(out.response_logprobs, out.response_mask, strict=True) if m] == (
        [-0.5] * sum(out.response_mask)
    )
    assert all(
        lp == 0.0 for lp, m in zip(out.response_logprobs, out.response_mask, strict=True) if not m
    )


@pytest.mark.skipif(not HAS_VERL, reason="verl is not installed (make verl)")
def test_a_fresh_process_that_imports_verl_has_the_loop():
    """What a Ray worker does: import verl, which loads the verl.plugins entry points."""
    import subprocess
    import sys

    code = (
        "import verl\n"
        "from verl.experimental.agent_loop.agent_loop import _agent_loop_registry as r\n"
        f"print({AGENT_NAME!r} in r)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert out.stdout.strip() == "True", out.stderr[-2000:]


@pytest.mark.skipif(not HAS_VERL, reason="verl is not installed (make verl)")
def test_a_ray_worker_that_imports_verl_has_the_loop_and_the_trainer():
    """verl builds its trainer (TaskRunner), agent loops and engines inside Ray actors: there
    the plug-in must be registered, and the FSDP engine patched, by ``import verl`` alone."""
    import ray

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:

        @ray.remote
        def registered() -> tuple[bool, str, bool]:
            import verl  # noqa: F401  (loads the verl.plugins entry points)
            from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
            from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

            names = ""
            if importlib.util.find_spec("transfer_queue") is not None:
                from verl.trainer.ppo.v1 import get_trainer_cls

                names = get_trainer_cls("actfocus").__name__
            patched = FSDPEngineWithLMHead.prepare_model_outputs
            return AGENT_NAME in _agent_loop_registry, names, patched.tokenergy_free_energy

        loop, trainer, patched = ray.get(registered.remote(), timeout=900)  # a cold import is slow
    finally:
        ray.shutdown()
    assert loop and patched
    assert trainer == ("ActFocusTrainer" if HAS_TRAINER else "")


class CharTokenizer:
    """One token per character (id = code point), 7 the end-of-sequence: tags take many tokens."""

    all_special_ids = (7,)

    def decode(self, ids, skip_special_tokens=False):
        return "".join("" if i == 7 else chr(i) for i in ids)


def test_roles_of_tags_split_into_many_tokens():
    tok = CharTokenizer()
    F, R, A = int(Role.FORMAT), int(Role.REASONING), int(Role.ACTION)
    text = "<think>ab</think> <answer>up</answer>"
    got = turn_roles(tok, [ord(c) for c in text] + [7])
    want = [F] * 7 + [R, R] + [F] * 8 + [R] + [F] * 8 + [A, A] + [F] * 9 + [F]
    assert got == want

    # a token that reaches into a tag is a tag token; text after </answer> is reasoning again
    class Merged(CharTokenizer):  # id c + 1000 reads "c<" : the last char runs into the tag
        def decode(self, ids, skip_special_tokens=False):
            return "".join(chr(i - 1000) + "<" if i >= 1000 else chr(i) for i in ids)

    ids = [ord(c) for c in "<answer>u"] + [ord("p") + 1000] + [ord(c) for c in "/answer>x"]
    assert turn_roles(Merged(), ids) == [F] * 8 + [A] + [F] + [F] * 8 + [R]
    # observations between turns
    mask = [1, 1, 0, 0, 1]
    assert response_roles(tok, [ord(c) for c in "abcde"], mask) == [R, R, 0, 0, R]


def test_the_advantage_scale_is_the_papers_weights_with_mean_one():
    F, R, A = int(Role.FORMAT), int(Role.REASONING), int(Role.ACTION)
    roles = torch.tensor([[R, R, F, A, A, F], [R, F, A, F, 0, 0]])
    energy = torch.tensor([[0.0, 0.0, 0.0, 1.0, 3.0, 0.0], [0.0, 0.0, 2.0, 0.0, 0.0, 0.0]])
    mask = roles != 0
    w = actfocus_weights(roles, energy, mask, 0.1, 0.5)
    scale = actfocus_advantage_scale(roles, energy, mask, 0.1, 0.5)
    assert float(scale[mask].mean()) == pytest.approx(1.0)
    assert torch.allclose(scale, w * 10 / w[mask].sum())
    # action energies 1, 3, 2: z = -1.22, 1.22, 0 -> 1 + 0.5 sigmoid(z)
    z = torch.tensor([-1.0, 1.0]) * (1.5**0.5)
    assert torch.allclose(w[0, 3:5], 1 + 0.5 * torch.sigmoid(z), atol=1e-5)
    assert float(w[1, 2]) == pytest.approx(1.25)
    assert not actfocus_advantage_scale(roles, energy, torch.zeros_like(mask)).any()
    # alpha 1, beta 0 is uniform: the advantages stay as they are, whatever verl's aggregation
    assert torch.equal(actfocus_advantage_scale(roles, energy, mask, 1.0, 0.0), mask.float())


def test_actfocus_settings_defaults_and_errors():
    assert actfocus_settings({}) == {"alpha": 0.1, "beta": 0.5, "format_weight": 1.0}
    assert actfocus_settings({"actfocus": {"beta": 1}})["beta"] == 1.0
    with pytest.raises(ValueError, match="alpha"):
        actfocus_settings({"actfocus": {"alpha": 2}})
    with pytest.raises(ValueError, match="unknown"):
        actfocus_settings({"actfocus": {"gamma": 2}})
    assert actfocus_settings({"actfocus": {"energy": "ref_surprisal"}})["alpha"] == 0.1
    assert actfocus_energy({}) == "ref_free_energy"
    assert actfocus_energy({"actfocus": {"energy": "ref_surprisal"}}) == "ref_surprisal"
    with pytest.raises(ValueError, match="energy"):
        actfocus_energy({"actfocus": {"energy": "policy_nll"}})


def _verl_batch(tok):
    """Two Sokoban episodes as verl holds them: padded responses, masks, reference log-probs
    and advantages."""
    eps = [ours(tok, "sokoban", s, 0.5, max_turns=5) for s in (3, 4)]
    gen = torch.Generator().manual_seed(0)
    rows = []
    for ep in eps:
        n = next(i for i, r in enumerate(ep.roles) if r != int(Role.OBSERVATION))  # the prompt
        mask = [int(r != int(Role.OBSERVATION)) for r in ep.roles[n:]]
        rows.append((ep.tokens[n:], mask, ep.roles[n:]))
    R = max(len(r[0]) for r in rows)
    responses = torch.zeros(2, R, dtype=torch.long)
    mask = torch.zeros(2, R, dtype=torch.long)
    roles = torch.zeros(2, R, dtype=torch.long)
    for i, (resp, m, rl) in enumerate(rows):
        responses[i, : len(resp)] = torch.tensor(resp)
        mask[i, : len(m)] = torch.tensor(m)
        roles[i, : len(rl)] = torch.tensor(rl)
    ref_lp = -torch.rand(2, R, generator=gen) * 3 * mask
    adv = torch.randn(2, 1, generator=gen).expand(2, R) * mask
    return responses, mask, ref_lp, adv, roles, [len(r[0]) for r in rows]


def _paper_case(seed: int):
    """The batch of :func:`_verl_batch`, its scaled advantages (the paper's alpha and beta), the
    paper's weights, and old / new log-probs whose ratios lie in (0.4, 2.5): some outside the
    clip range, none at verl's dual clip (3)."""
    tok = build_tokenizer()
    responses, mask, ref_lp, adv, roles, lengths = _verl_batch(tok)
    settings = {"alpha": 0.1, "beta": 0.5, "format_weight": 1.0}
    scaled, metrics = scale_batch_advantages(tok, responses, mask, -ref_lp, adv, settings)
    w = actfocus_weights(roles, -ref_lp, mask.bool(), 0.1, 0.5)
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(mask.shape, generator=gen)
    new = old + (0.4 * torch.randn(mask.shape, generator=gen)).clamp(-0.9, 0.9)
    return responses, mask, adv, lengths, scaled, metrics, w, old, new


def test_scaled_advantages_give_the_papers_loss_through_a_token_mean():
    """For w >= 0 the clipped loss of w*A is w times that of A: a token-mean loss of the
    scaled advantages is the paper's sum(w l) / sum(w)."""
    _, mask, adv, _, scaled, metrics, w, old, new = _paper_case(seed=1)
    m = mask.bool()
    theirs, _ = ppo_policy_loss(new, old, scaled, m, 0.2, clip_eps_high=0.28)
    paper, _ = ppo_policy_loss(new, old, adv, m, 0.2, weights=w, clip_eps_high=0.28,
                               normalize="weights")  # fmt: skip
    assert float(theirs) == pytest.approx(float(paper), rel=1e-5)
    assert metrics["actfocus/reasoning_weight"] < 1 < metrics["actfocus/action_weight"]
    if HAS_VERL:  # verl's own clipped loss (dual clip included) agrees
        from types import SimpleNamespace

        from verl.trainer.ppo.core_algos import get_policy_loss_fn

        cfg = SimpleNamespace(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28,
                              global_batch_info={}, get=lambda k, d=None: d)  # fmt: skip
        verl_loss, _ = get_policy_loss_fn("vanilla")(
            old_log_prob=old, log_prob=new, advantages=scaled, response_mask=m,
            loss_agg_mode="token-mean", config=cfg, rollout_is_weights=None,
        )  # fmt: skip
        assert float(verl_loss) == pytest.approx(float(paper), rel=1e-5)


def _fake_queue(monkeypatch, plug, store):
    """TransferQueue replaced by the dict ``store`` of nested tensors."""
    from tensordict import TensorDict
    from transfer_queue import KVBatchMeta

    def meta(keys, fields=None):
        return KVBatchMeta(keys=keys, tags=[{} for _ in keys], partition_id="train",
                           fields=fields)  # fmt: skip

    def kv_batch_get(keys, partition_id, select_fields=None):
        got = {f: store[f] for f in select_fields if f in store}
        return TensorDict(got, batch_size=[len(keys)])

    def kv_batch_put(keys, partition_id, fields=None, tags=None, data_parser=None):
        store.update(dict(fields.items()))
        return meta(keys, sorted(store))

    monkeypatch.setattr(plug.tq, "kv_batch_get", kv_batch_get)
    monkeypatch.setattr(plug.tq, "kv_batch_put", kv_batch_put)
    return meta


def _nested(x, lengths):
    return torch.nested.as_nested_tensor([x[i, :n] for i, n in enumerate(lengths)],
                                         layout=torch.jagged)  # fmt: skip


@pytest.mark.skipif(not HAS_TRAINER, reason="verl's v1 trainer is not installed (make verl)")
@pytest.mark.parametrize("energy", ["ref_free_energy", "ref_surprisal"])
def test_the_actfocus_trainer_scales_the_advantages_verl_stores(monkeypatch, energy):
    """``trainer.v1.trainer_mode=actfocus`` resolves to our trainer; after verl's advantages it
    stores them times the ActFocus scale of the batch, with the energy the setting names
    (TransferQueue replaced by a dict)."""
    from omegaconf import OmegaConf
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    import tokenergy.integrations.verl as plug

    assert get_trainer_cls("actfocus") is plug.ActFocusTrainer
    tok = build_tokenizer()
    responses, mask, ref_lp, adv, roles, lengths = _verl_batch(tok)
    free = (-3.0 - torch.rand(mask.shape, generator=torch.Generator().manual_seed(5))) * mask
    store = {k: _nested(v, lengths) for k, v in {
        "responses": responses, "response_mask": mask, "ref_log_prob": ref_lp,
        "ref_free_energy": free, "advantages": adv}.items()}  # fmt: skip
    meta = _fake_queue(monkeypatch, plug, store)
    # verl's own advantage step is what the store already holds
    monkeypatch.setattr(PPOTrainerSync, "_compute_advantage", lambda self, batch, metrics: batch)
    trainer = object.__new__(plug.ActFocusTrainer)
    trainer.tokenizer = tok
    trainer.config = OmegaConf.create({"algorithm": {"actfocus": {"beta": 1.0, "energy": energy}}})
    metrics = {}
    trainer._compute_advantage(meta(["u0_0_0", "u1_0_0"]), metrics)
    e = free if energy == "ref_free_energy" else -ref_lp
    want = adv * actfocus_advantage_scale(roles, e, mask.bool(), 0.1, 1.0)
    assert torch.allclose(store["advantages"].to_padded_tensor(0.0), want[:, : max(lengths)])
    assert 0 < metrics["actfocus/action_share"] < 0.2
    del store["ref_free_energy"], store["ref_log_prob"]
    with pytest.raises(ValueError, match="use_kl_loss"):
        trainer._compute_advantage(meta(["u0_0_0", "u1_0_0"]), {})


@pytest.mark.skipif(not HAS_TRAINER, reason="verl's v1 trainer is not installed (make verl)")
@pytest.mark.parametrize("ref_in_actor", [False, True])
def test_the_reference_step_stores_the_free_energy_and_keeps_the_actors_entropy(
    monkeypatch, ref_in_actor
):
    """The reference worker is called with the free-energy flag (and only that call: the flag is
    gone after it); what it returns in the entropy's place is stored over the response as
    ``ref_free_energy``, its log-probs as ``ref_log_prob``, and the actor's entropy stays."""
    from omegaconf import OmegaConf

    import tokenergy.integrations.verl as plug

    prompt_len, lengths = [3, 2], [4, 6]
    full = [p + n for p, n in zip(prompt_len, lengths, strict=True)]
    gen = torch.Generator().manual_seed(0)
    seq_lp = [-torch.rand(n, generator=gen) for n in full]
    seq_free = [-5 - torch.rand(n, generator=gen) for n in full]
    actor_entropy = torch.rand(2, 6, generator=gen)
    resp_mask = torch.tensor([[1, 1, 0, 1, 0, 0], [1, 1, 1, 0, 1, 1]])
    store = {"response_mask": _nested(resp_mask, lengths),
             "entropy": _nested(actor_entropy, lengths)}  # fmt: skip
    meta = _fake_queue(monkeypatch, plug, store)
    seen = []

    class Workers:
        def _call(self, batch):
            seen.append(dict(batch.extra_info))
            store["log_probs"] = torch.nested.as_nested_tensor(seq_lp, layout=torch.jagged)
            store["entropy"] = torch.nested.as_nested_tensor(seq_free, layout=torch.jagged)
            return batch

        compute_ref_log_prob = compute_log_prob = _call

    trainer = object.__new__(plug.ActFocusTrainer)
    trainer.config = OmegaConf.create(
        {"algorithm": {}, "actor_rollout_ref": {"rollout": {"temperature": 1.0}}}
    )
    trainer.ref_in_actor = ref_in_actor
    trainer.ref_policy_wg = trainer.actor_rollout_wg = Workers()
    batch = meta(["a", "b"], sorted(store))
    trainer._compute_ref_log_prob(batch, {})
    assert seen[0][plug.FREE_ENERGY_FLAG] and seen[0]["calculate_entropy"]
    assert seen[0].get("no_lora_adapter", False) == ref_in_actor
    assert (
        plug.FREE_ENERGY_FLAG not in batch.extra_info and not batch.extra_info["calculate_entropy"]
    )
    for i, (p, n) in enumerate(zip(prompt_len, lengths, strict=True)):
        # the response's values of a whole-sequence output: positions p-1 .. p+n-2 (shifted)
        assert torch.allclose(store["ref_free_energy"][i], seq_free[i][p - 1 : p + n - 1])
        assert torch.allclose(store["ref_log_prob"][i], seq_lp[i][p - 1 : p + n - 1])
        assert torch.equal(store["entropy"][i], actor_entropy[i, :n])


def _engine_case(remove_padding: bool, flag: bool, fused: bool = False):
    """verl's FSDP engine's ``prepare_model_outputs`` (patched by the plug-in) on two sequences
    of random logits, with the engine's state it reads and nothing else; the output and the
    logits of each sequence's tokens."""
    from types import SimpleNamespace

    import verl.utils.torch_functional as verl_F
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    import tokenergy.integrations.verl as plug

    gen = torch.Generator().manual_seed(1)
    lengths, V = [5, 3], 11
    ids = [torch.randint(V, (n,), generator=gen) for n in lengths]
    rows = [3 * torch.randn(n, V, generator=gen) for n in lengths]
    engine = object.__new__(FSDPEngineWithLMHead)
    engine.engine_config = SimpleNamespace(entropy_checkpointing=False,
                                           entropy_from_logits_with_chunking=False)  # fmt: skip
    engine.compute_entropy_from_logits = verl_F.entropy_from_logits
    engine.use_ulysses_sp = False
    micro = TensorDict({"input_ids": torch.nested.as_nested_tensor(ids, layout=torch.jagged)},
                       batch_size=[2])  # fmt: skip
    tu.assign_non_tensor(micro, use_remove_padding=remove_padding, use_fused_kernels=fused,
                         calculate_entropy=True, **{plug.FREE_ENERGY_FLAG: flag})  # fmt: skip
    rolled = torch.cat([torch.roll(i, -1) for i in ids])
    args = {"input_ids_rmpad_rolled": rolled, "temperature_is_one": True, "pad_size": 0,
            "temperature_rmpad": torch.ones(sum(lengths)), "temperature": torch.ones(2)}  # fmt: skip
    if remove_padding:
        logits = torch.cat(rows)[None]
    else:
        logits = torch.zeros(2, max(lengths), V)
        for i, r in enumerate(rows):
            logits[i, : len(r)] = r
    out = engine.prepare_model_outputs(SimpleNamespace(logits=logits), args, micro, None)
    return engine, out, rows, ids, verl_F


@pytest.mark.skipif(not HAS_VERL, reason="verl is not installed (make verl)")
@pytest.mark.parametrize("remove_padding", [True, False])
def test_the_patched_engine_returns_the_free_energy_for_a_flagged_batch(remove_padding):
    """Flagged, verl's own output code gives -logsumexp of each position's logits where it
    gives the entropy (the log-probs unchanged); unflagged, the entropy; either way the
    engine's entropy function is its own again after the call."""
    import tokenergy.integrations.verl as plug

    for flag in (True, False):
        engine, out, rows, ids, verl_F = _engine_case(remove_padding, flag)
        for i, (r, t) in enumerate(zip(rows, ids, strict=True)):
            logp = torch.log_softmax(r, -1)
            want = -torch.logsumexp(r, -1) if flag else -(logp.exp() * logp).sum(-1)
            assert torch.allclose(out["entropy"][i], want, atol=1e-5)
            nxt = torch.roll(t, -1)
            assert torch.allclose(out["log_probs"][i], logp.gather(-1, nxt[:, None])[:, 0],
                                  atol=1e-5)  # fmt: skip
        assert engine.compute_entropy_from_logits is verl_F.entropy_from_logits
        assert verl_F.entropy_from_logits is not plug.negative_logsumexp
    with pytest.raises(ValueError, match="fused"):
        _engine_case(remove_padding, True, fused=True)


def _script_overrides(name: str, *args: str) -> list[str]:
    """The ``key=value`` lines of an example script, after those of the script it calls
    (``${ALGO}`` in its name is the script's first argument)."""
    import re
    from pathlib import Path

    text = (Path(__file__).parent.parent / "examples" / "verl" / name).read_text()
    called = re.findall(r'bash "\$\(dirname "\$0"\)/(\S+)"', text)
    if called and args:
        called = [called[0].replace("${ALGO}", args[0])]
    base = _script_overrides(called[0]) if called else []
    return base + re.findall(r"^\s+(\S+=\S+) \\$", text, re.M)


@pytest.mark.skipif(not HAS_TRAINER, reason="verl's v1 trainer is not installed (make verl)")
@pytest.mark.parametrize(
    ("script", "args"),
    [("sokoban_grpo.sh", ()), ("sokoban_ppo.sh", ()),
     ("sokoban_actfocus.sh", ("grpo",)), ("sokoban_actfocus.sh", ("ppo",))],
)  # fmt: skip
def test_the_example_configs_pass_verls_validation(script, args, tmp_path):
    import os

    import verl
    from hydra import compose, initialize_config_dir
    from transformers import LlamaConfig, LlamaForCausalLM
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.utils.config import validate_config

    import tokenergy.integrations.verl as plug

    overrides = _script_overrides(script, *args)
    # verl reads the critic's model config when it checks it: a local stand-in for Qwen
    tok = build_tokenizer()
    tiny = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                       num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2)  # fmt: skip
    LlamaForCausalLM(tiny).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    qwen = "Qwen/Qwen2.5-0.5B-Instruct"
    assert f"actor_rollout_ref.model.path={qwen}" in overrides
    overrides = [o.replace(qwen, str(tmp_path)) for o in overrides]
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        cfg = compose("ppo_trainer", overrides=overrides)
    validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg),
                    use_critic=need_critic(cfg))  # fmt: skip
    n = cfg.actor_rollout_ref.rollout.n
    assert (cfg.data.train_batch_size * n, cfg.actor_rollout_ref.actor.ppo_mini_batch_size * n) == (
        128,
        32,
    )  # the paper's 128 trajectories, minibatches of 32
    assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop == AGENT_NAME
    ppo = script == "sokoban_ppo.sh" or args == ("ppo",)
    assert need_critic(cfg) == ppo and cfg.algorithm.adv_estimator == ("gae" if ppo else "grpo")
    if ppo:
        assert (cfg.algorithm.gamma, cfg.algorithm.lam, cfg.critic.optim.lr) == (1.0, 1.0, 1e-5)
    trainer = get_trainer_cls(cfg.trainer.v1.trainer_mode)
    if script == "sokoban_actfocus.sh":
        assert trainer is plug.ActFocusTrainer and need_reference_policy(cfg)
        assert cfg.actor_rollout_ref.actor.kl_loss_coef == 0
        assert actfocus_settings(cfg.algorithm) == {"alpha": 0.1, "beta": 0.5, "format_weight": 1.0}
    else:
        assert trainer is not plug.ActFocusTrainer and not need_reference_policy(cfg)


@pytest.mark.skipif(not HAS_VERL, reason="verl is not installed (make verl)")
def test_verls_actor_loss_on_its_tensordict_is_the_papers_loss_in_value_and_gradient():
    """The scaled advantages through ``verl.workers.utils.losses.ppo_loss`` as verl's actor
    calls it (nested no-padding tensors, the log-probs of whole sequences shifted by one):
    the paper's ``sum(w l) / sum(w)``, and the same gradient with respect to the log-probs."""
    from types import SimpleNamespace

    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import ppo_loss

    responses, mask, adv, lengths, scaled, _, w, old, new = _paper_case(seed=2)
    new = new.requires_grad_()
    prompt_len = [5, 3]

    def nested(rows):
        return torch.nested.as_nested_tensor(rows, layout=torch.jagged)

    # the model's output over prompt + response: position t holds the log-prob of token t + 1
    seq_lp = [
        torch.cat([torch.zeros(p - 1), new[i, :n], torch.zeros(1)])
        for i, (p, n) in enumerate(zip(prompt_len, lengths, strict=True))
    ]
    data = TensorDict(
        {
            "prompts": nested([torch.ones(p, dtype=torch.long) for p in prompt_len]),
            "responses": nested([responses[i, :n] for i, n in enumerate(lengths)]),
            "response_mask": nested([mask[i, :n] for i, n in enumerate(lengths)]),
            "old_log_probs": nested([old[i, :n] for i, n in enumerate(lengths)]),
            "advantages": nested([scaled[i, :n] for i, n in enumerate(lengths)]),
        },
        batch_size=[2],
    )
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=None, global_batch_size=None)
    cfg = SimpleNamespace(
        global_batch_info={}, loss_scale_factor=None, loss_agg_mode="token-mean",
        policy_loss={"loss_mode": "vanilla"}, entropy_coeff=0.0, use_kl_loss=False,
        clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, get=lambda k, d=None: d,
    )  # fmt: skip
    theirs, _ = ppo_loss(cfg, {"log_probs": nested(seq_lp)}, data)
    (grad_theirs,) = torch.autograd.grad(theirs, new)
    m = mask.bool()
    paper, _ = ppo_policy_loss(new, old, adv, m, 0.2, weights=w, clip_eps_high=0.28,
                               normalize="weights")  # fmt: skip
    (grad_paper,) = torch.autograd.grad(paper, new)
    assert float(theirs) == pytest.approx(float(paper), rel=1e-5)
    assert torch.allclose(grad_theirs, grad_paper, atol=1e-7)
