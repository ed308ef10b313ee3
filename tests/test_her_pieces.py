"""The replay's pieces plug in from outside: a relabeler and a returns class defined here, the shorthands
resolved in one place, the built-in classes by name."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import DESIRED, TagEnvs, make_tag_storage, reference_live, tag_reward

import her


class OppositeGoal:
    """A user's goal-selection rule: always relabel, with the achieved goal of the state *before* t (t = 0:
    its own state), so it is none of the built-in strategies."""

    def relabel(self, storage, slots, records, rng):
        back = np.where(records["step"] > 0, slots - 1, slots)
        return storage.achieved_goal[back % storage.n_slots].copy(), np.ones(len(slots), bool)


class TwoStepNoDiscount:
    """A user's return: ``r_t + r_{t+1}`` (the episode permitting), bootstrap from ``s_{t+m}`` with discount 1."""

    gamma = 1.0

    def build(self, storage, slots, records, goals, compute_reward):
        m = np.minimum(2, records["length"] - records["step"]).astype(np.int64)
        r = np.zeros(len(slots), np.float32)
        for j in range(2):
            rec = storage.gather(slots + j)
            info = {k: rec["info." + k] for k in storage.info_shapes}
            r += np.where(j < m, compute_reward(storage.achieved_goal[(slots + j + 1) % storage.n_slots], goals,
                                                info), 0.0).astype(np.float32)
        return her.ReturnBatch(r, np.ones(len(slots), np.float32), np.zeros(len(slots), bool), slots + m, m)


def _storage():
    storage = make_tag_storage(80, n_envs=2, max_episode_steps=6)
    run = TagEnvs(storage, [[(6, False), (3, False)], [(5, False)]]).step(40)
    return storage, run, reference_live(run, storage.n_slots)


def test_a_relabeler_and_a_returns_class_of_the_users_own_plug_in():
    storage, run, live = _storage()
    assert isinstance(OppositeGoal(), her.Relabeler) and isinstance(TwoStepNoDiscount(), her.Returns)
    buf = her.HerReplayBuffer(storage, tag_reward, relabeler=OppositeGoal(), returns=TwoStepNoDiscount(), seed=0)
    b = buf.sample(2000)
    e, t = b.observation[:, 0].astype(int), b.observation[:, 1].astype(int)
    assert set(e.tolist()) <= set(live)
    np.testing.assert_array_equal(b.desired_goal, np.stack([e, np.maximum(t - 1, 0)], 1))  # the user's goals
    assert b.relabeled.all()
    L = np.array([run.episodes[i].length for i in e])
    m = np.minimum(2, L - t)
    np.testing.assert_array_equal(b.n_steps, m)
    np.testing.assert_array_equal(b.next_observation[:, :2], np.stack([e, t + m], 1))  # bootstrap state s_{t+m}
    want = sum(np.where(j < m, tag_reward(np.stack([e, t + j + 1], 1).astype(np.float32), b.desired_goal,
                                          {"w": np.array([[run.episodes[i].info(s + j)] for i, s in zip(e, t)],
                                                         np.float32)}), 0.0) for j in range(2))
    np.testing.assert_allclose(b.reward, want, rtol=1e-6)
    assert (b.discount == 1.0).all() and buf.gamma == 1.0 and buf.n_step == 1
    # a prioritized sampler composes with them
    sampler = her.PrioritizedSampler()
    buf = her.HerReplayBuffer(storage, tag_reward, sampler=sampler, relabeler=OppositeGoal(),
                              returns=TwoStepNoDiscount(), seed=1)
    b = buf.sample(500)
    buf.update_priorities(b.index, np.abs(b.reward))
    assert (b.weight > 0).all() and (b.weight <= 1).all()


def test_shorthands_build_the_named_classes():
    storage, _, _ = _storage()
    buf = her.HerReplayBuffer(storage, tag_reward, strategy="mixed", n_sampled_goal=2, other_desired_fraction=0.3,
                              n_step=3, gamma=0.9)
    assert isinstance(buf.relabeler, her.MixedGoals) and buf.relabeler.other_desired_fraction == 0.3
    assert buf.relabeler.relabel_probability == 2 / 3
    assert isinstance(buf.returns, her.NStepReturn) and (buf.n_step, buf.gamma) == (3, 0.9)
    assert isinstance(buf.sampler, her.UniformSampler)
    for name, cls in [("future", her.FutureGoals), ("final", her.FinalGoal), ("episode", her.EpisodeGoals)]:
        assert type(her.make_relabeler(name)) is cls and type(her.make_relabeler(her.RelabelStrategy(name))) is cls
    assert isinstance(her.HerReplayBuffer(storage, tag_reward).returns, her.OneStepReturn)
    assert [str(s) for s in her.RelabelStrategy] == ["future", "final", "episode", "mixed"]
    assert her.RelabelStrategy.MIXED == "mixed" and her.HerReplayBuffer(
        storage, tag_reward, strategy=her.RelabelStrategy.FINAL).relabeler.strategy is her.RelabelStrategy.FINAL
    with pytest.raises(ValueError, match=r"relabel strategy must be one of \('future', 'final', 'episode', "
                                         r"'mixed'\), got 'futureactual'"):
        her.make_relabeler("futureactual")


def test_no_relabel_keeps_every_stored_goal():
    storage, _, _ = _storage()
    b = her.HerReplayBuffer(storage, tag_reward, relabeler=her.NoRelabel(), seed=0).sample(1000)
    assert not b.relabeled.any() and (b.desired_goal == DESIRED).all()


@pytest.mark.parametrize("kw,match", [
    ({"relabeler": OppositeGoal(), "strategy": "final"}, "pass relabeler= or its shorthand strategy, not both"),
    ({"relabeler": OppositeGoal(), "n_sampled_goal": 2}, "pass relabeler= or its shorthand n_sampled_goal"),
    ({"returns": TwoStepNoDiscount(), "n_step": 3}, "pass returns= or its shorthand n_step, not both"),
    ({"returns": TwoStepNoDiscount(), "gamma": 0.5}, "pass returns= or its shorthand gamma, not both"),
    ({"relabeler": object()}, "relabeler must have a relabel"),
    ({"returns": 3}, "returns must have a build"),
    ({"n_step": 0}, "n_step must be an integer >= 1, got 0"),
    ({"gamma": 1.5}, r"gamma must be in \(0, 1\], got 1.5"),
])
def test_inconsistent_pieces_are_refused_with_a_clear_message(kw, match):
    storage, _, _ = _storage()
    with pytest.raises((ValueError, TypeError), match=match):
        her.HerReplayBuffer(storage, tag_reward, **kw)


def test_a_relabeler_for_a_goal_free_storage_is_refused():
    storage = her.EpisodeStorage(50, (2,), (1,))
    with pytest.raises(ValueError, match="a relabeler needs a goal storage"):
        her.HerReplayBuffer(storage, relabeler=OppositeGoal())
    assert her.HerReplayBuffer(storage).relabeler is None
    # asking for relabeling by its shorthands is refused too (HER would silently be off), except k = 0
    with pytest.raises(ValueError, match="n_sampled_goal, strategy relabel goals, but this storage was built "
                                         "without goal_shape"):
        her.HerReplayBuffer(storage, strategy="episode", n_sampled_goal=7)
    with pytest.raises(ValueError, match="other_desired_fraction relabel goals"):
        her.HerReplayBuffer(storage, other_desired_fraction=0.2)
    assert her.HerReplayBuffer(storage, n_sampled_goal=0).relabeler is None


@pytest.mark.parametrize("make, error, match", [
    (lambda s: her.HerReplayBuffer("x", tag_reward), TypeError,
     "storage must be an her.EpisodeStorage .*got str"),
    (lambda s: her.PrioritizedSampler("x"), TypeError, "storage must be an her.EpisodeStorage .*got str"),
    (lambda s: her.PrioritizedSampler().attach([]), TypeError, "storage must be an her.EpisodeStorage .*got list"),
    (lambda s: her.UniformSampler().attach([]), TypeError, "storage must be an her.EpisodeStorage .*got list"),
    (lambda s: her.HerReplayBuffer(s, tag_reward, sampler=object()), TypeError, "sampler must have a sample"),
    (lambda s: her.storage_from_env(None, 100), TypeError, "env must be a gymnasium env or vector env"),
    (lambda s: her.HerReplayBuffer(s, tag_reward, seed=-1), ValueError, "seed must be an integer >= 0 or None, got -1"),
    (lambda s: her.HerReplayBuffer(s, tag_reward, seed="x"), ValueError, "seed must be an integer >= 0 or None"),
    (lambda s: her.PrioritizedSampler(s, beta_annealing_steps=-1), ValueError,
     "beta_annealing_steps must be an integer >= 0"),
])
def test_wrong_objects_and_seeds_are_refused_naming_the_argument(make, error, match):
    storage, _, _ = _storage()
    with pytest.raises(error, match=match):
        make(storage)


# ---------------------------------------------------------------------------------------------------------
# Samplers take the storage per call; a sampler is built without one
# ---------------------------------------------------------------------------------------------------------


def test_samplers_are_built_without_a_storage_and_take_it_per_call():
    storage, _, _ = _storage()
    uniform = her.UniformSampler()
    slots, w = uniform.sample(storage, 64, np.random.default_rng(0))
    assert slots.dtype == np.int64 and storage.is_transition(slots).all() and (w == 1).all()
    p = her.PrioritizedSampler(alpha=0.7, beta0=0.5)  # settings checked, nothing sized yet
    with pytest.raises(ValueError, match="not attached to a storage yet"):
        p.priorities(np.array([0]))
    drawn, w = p.sample(storage, 64, np.random.default_rng(0))  # an unattached sampler attaches on first use
    assert storage.is_transition(drawn).all() and (w == 1).all()
    np.testing.assert_array_equal(p.priorities(storage.transition_slots()), 1.0)
    p.attach(storage)  # again: nothing happens
    other, _, _ = _storage()
    with pytest.raises(ValueError, match="attached to another storage"):
        p.sample(other, 4, np.random.default_rng(0))
    with pytest.raises(ValueError, match="attached to another storage"):
        her.HerReplayBuffer(other, tag_reward, sampler=p)
    assert isinstance(p, her.Sampler) and isinstance(uniform, her.Sampler)


def test_a_storage_first_prioritized_sampler_is_the_attached_shortcut():
    storage, _, _ = _storage()
    a = her.PrioritizedSampler(storage, 0.7, 0.5, eps=1e-3)  # the call agents/ make
    b = her.PrioritizedSampler(alpha=0.7, beta0=0.5, eps=1e-3)
    b.attach(storage)
    bufs = [her.HerReplayBuffer(storage, tag_reward, sampler=s, seed=4) for s in (a, b)]
    x, y = (buf.sample(100) for buf in bufs)
    np.testing.assert_array_equal(x.index, y.index)
    np.testing.assert_array_equal(x.weight, y.weight)


def test_a_sampler_of_your_own_needs_no_attach():
    class FirstSlots:  # the oldest B transitions, weights 1
        prioritized = False

        def sample(self, storage, batch_size, rng):
            return storage.transition_slots()[:batch_size], np.ones(batch_size, np.float32)

        def state_dict(self):
            return {}

        def load_state_dict(self, state):
            pass

    storage, _, _ = _storage()
    b = her.HerReplayBuffer(storage, tag_reward, sampler=FirstSlots(), seed=0).sample(8)
    np.testing.assert_array_equal(b.index, storage.transition_slots()[:8])


def test_prioritized_settings_are_checked_without_a_storage():
    with pytest.raises(ValueError, match=r"beta0 must be in \[0, 1\], got 2.0"):
        her.PrioritizedSampler(alpha=0.6, beta0=2.0)
    with pytest.raises(ValueError, match="branching must be an integer >= 2"):
        her.PrioritizedSampler(branching=1)


# ---------------------------------------------------------------------------------------------------------
# Curated names
# ---------------------------------------------------------------------------------------------------------


#: modules that import an optional dependency (torch, tensordict, stable-baselines3) at the top
OPTIONAL_MODULES = ("sb3", "torchrl", "torchrl_tensordict")


def test_every_her_module_has_a_curated_all():
    import importlib
    import pkgutil

    for info in pkgutil.iter_modules(her.__path__):
        if info.name in OPTIONAL_MODULES:  # optional dependencies; their __all__ is checked by their tests
            continue
        module = importlib.import_module(f"her.{info.name}")
        assert hasattr(module, "__all__"), info.name
        assert all(hasattr(module, name) for name in module.__all__), info.name
    assert all(hasattr(her, name) for name in her.__all__)
    assert {"SumTree", "MinTree", "MaxTree", "SegmentTree", "STRATEGIES", "GoalRelabeler"}.isdisjoint(her.__all__)
    for piece in ("EpisodeStorage", "EpisodeWriter", "UniformSampler", "PrioritizedSampler", "FutureGoals",
                  "NStepReturn", "HerReplayBuffer", "Batch", "RelabelStrategy", "make_relabeler", "make_returns"):
        assert piece in her.__all__


@pytest.mark.parametrize("kw, relabel_kw, returns_kw", [
    ({}, {}, {}),
    ({"strategy": "final"}, {"strategy": "final"}, {}),
    ({"strategy": "mixed", "n_sampled_goal": 2, "other_desired_fraction": 0.25},
     {"strategy": "mixed", "n_sampled_goal": 2, "other_desired_fraction": 0.25}, {}),
    ({"n_step": 3, "gamma": 0.9, "n_sampled_goal": 0}, {"n_sampled_goal": 0}, {"n_step": 3, "gamma": 0.9}),
])
def test_shorthands_are_the_piece_factories_and_nothing_more(kw, relabel_kw, returns_kw):
    """The shorthand arguments give exactly ``make_relabeler(**relabel ones)`` and ``make_returns(**return ones)``:
    the defaults of a shorthand left out are the factories' own (no second set in the buffer)."""
    storage, _, _ = _storage()
    short = her.HerReplayBuffer(storage, tag_reward, seed=3, **kw)
    expected_relabeler, expected_returns = her.make_relabeler(**relabel_kw), her.make_returns(**returns_kw)
    assert type(short.relabeler) is type(expected_relabeler)
    assert vars(short.relabeler) == vars(expected_relabeler)
    assert type(short.returns) is type(expected_returns)
    assert (short.returns.gamma, short.n_step) == (expected_returns.gamma, getattr(expected_returns, "n_step", 1))
    storage2, _, _ = _storage()
    pieces = her.HerReplayBuffer(storage2, tag_reward, relabeler=expected_relabeler, returns=expected_returns, seed=3)
    a, b = short.sample(64), pieces.sample(64)
    for name in ("index", "desired_goal", "reward", "discount", "relabeled"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))


def test_a_piece_with_its_shorthand_is_refused_even_at_the_default_value():
    storage, _, _ = _storage()
    with pytest.raises(ValueError, match="pass returns= or its shorthand gamma, not both"):
        her.HerReplayBuffer(storage, tag_reward, returns=her.make_returns(), gamma=0.98)
    assert "resolve_pieces" not in her.__all__ and not hasattr(her, "resolve_pieces")


# ---------------------------------------------------------------------------------------------------------
# Module shape: each module fits in 500 lines and imports on its own (no import cycle)
# ---------------------------------------------------------------------------------------------------------


def test_her_modules_are_at_most_500_lines():
    import pathlib

    sizes = {p.name: len(p.read_text().splitlines()) for p in pathlib.Path(her.__file__).parent.glob("*.py")}
    assert {name: n for name, n in sizes.items() if n > 500} == {}


def test_each_her_module_imports_on_its_own():
    """Imported first in a fresh interpreter, each module's relative imports must not come back to it."""
    import importlib.util
    import pkgutil
    import subprocess
    import sys

    torch_ok = all(importlib.util.find_spec(m) is not None for m in ("torch", "tensordict"))
    names = [i.name for i in pkgutil.iter_modules(her.__path__)
             if i.name != "sb3" and (torch_ok or i.name not in OPTIONAL_MODULES)]
    for name in names:
        r = subprocess.run([sys.executable, "-c", f"import her.{name}"], capture_output=True, text=True,
                           timeout=120, check=False)
        assert r.returncode == 0, (name, r.stderr[-2000:])
