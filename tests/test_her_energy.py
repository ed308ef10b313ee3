"""Energy-based episode prioritization (Zhao & Tresp 2018): the trajectory energy, the episode shares a sampler
draws, eviction, reloading a storage, composition with the buffer, and the config keys."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

import her
from her_agents.config import ReplayConfig, check_replay

DT = 0.04
G = 9.81


def positions(T: int, step: np.ndarray | None = None, start=(1.3, 0.7, 0.42)) -> np.ndarray:
    """[T + 1, 3] positions of an object moving by ``step`` per env step (still when None)."""
    step = np.zeros(3) if step is None else np.asarray(step, float)
    return np.asarray(start, float) + np.arange(T + 1)[:, None] * step


def goal_storage(capacity: int, T: int) -> her.EpisodeStorage:
    return her.EpisodeStorage(capacity, (2,), (1,), (3,), max_episode_steps=T)


def add(storage: her.EpisodeStorage, ag: np.ndarray) -> int:
    T = len(ag) - 1
    start, _ = storage.add_episode(np.zeros((T + 1, 2)), np.zeros((T, 1)), np.zeros(T), achieved_goal=ag,
                                   desired_goal=ag[-1])
    return start


def test_trajectory_energy_of_a_still_a_rising_and_a_sliding_object():
    assert her.trajectory_energy(positions(10), DT) == 0.0
    # rising 1 cm per step: E_t = g * 0.01 t + 0.5 (0.01 / dt)^2, so E_1 = 0.0981 + 0.03125 and then + 0.0981 a step
    rise = her.trajectory_energy(positions(10, [0, 0, 0.01]), DT)
    assert rise == pytest.approx(10 * G * 0.01 + 0.5 * (0.01 / DT) ** 2)
    # sliding at constant speed: only the first step gains (kinetic) energy
    slide = her.trajectory_energy(positions(10, [0.01, 0, 0]), DT)
    assert slide == pytest.approx(0.5 * (0.01 / DT) ** 2)
    # the per-step clip: a 10 cm jump gains g * 0.1 + 3.125 > 0.5 in one step
    jump = np.concatenate([positions(1), positions(0, start=(1.3, 0.7, 0.52))])
    assert her.trajectory_energy(jump, DT, clip_energy=0.5) == pytest.approx(0.5)
    # a fall gains nothing (the potential energy lost exceeds the kinetic gained); one value per batched episode
    fall = positions(5, [0, 0, -0.01])
    batch = her.trajectory_energy(np.stack([fall, positions(5, [0, 0, 0.01])]), DT)
    assert batch.shape == (2,) and batch[0] == 0.0 and batch[1] == pytest.approx(5 * G * 0.01 + 0.5 * (0.01 / DT) ** 2)


@pytest.mark.parametrize("kwargs, match", [
    ({"dt": 0.0}, "dt must be"), ({"dt": DT, "clip_energy": -1.0}, "clip_energy must be"),
    ({"dt": DT, "eps": 0.0}, "eps must be"), ({"dt": DT, "height_axis": 3}, "height_axis must be"),
    ({"dt": DT, "kinetic_weight": -0.1}, "kinetic_weight must be"), ({"dt": DT, "exponent": 0.0}, "exponent must be"),
    ({"dt": DT, "exponent": float("inf")}, "exponent must be"), ({"dt": DT, "exponent": 1000.0}, "exponent must be"),
    ({"dt": DT, "eps": 1e-200, "exponent": 10.0}, "underflows to 0"), ({"dt": DT, "gravity": float("nan")}, "gravity"),
    ({"dt": DT, "height_axis": -1}, "height_axis must be"), ({"dt": DT, "branching": True}, "branching must be"),
])
def test_bad_settings_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        her.EnergySampler(**kwargs)


@pytest.mark.parametrize("kwargs", [{"dt": "0.04"}, {"dt": None}, {"dt": True}, {"dt": DT, "exponent": "2"},
                                    {"dt": DT, "kinetic_weight": None}, {"dt": DT, "gravity": "9.81"},
                                    {"dt": np.array([0.04, 1.0])}, {"dt": DT, "eps": True}])
def test_settings_that_are_not_numbers_are_refused_by_name(kwargs):
    name = [k for k in kwargs if k != "dt"][0] if len(kwargs) > 1 else "dt"
    with pytest.raises(TypeError, match=rf"^{name} must be"):
        her.EnergySampler(**kwargs)


def test_trajectory_energy_refuses_what_is_not_a_trajectory():
    for bad, match in [(np.zeros((1, 3)), "T >= 1"), (np.zeros((0, 3)), "T >= 1"), (np.zeros((5, 2)), "G >= 3"),
                       (np.full((5, 3), np.nan), "finite"), (np.full((5, 3), np.inf), "finite")]:
        with pytest.raises(ValueError, match=match):
            her.trajectory_energy(bad, DT)
    for kwargs, match in [({"height_axis": 3}, "height_axis"), ({"height_axis": 1.5}, "height_axis"),
                          ({"gravity": float("nan")}, "gravity"), ({"kinetic_weight": float("inf")}, "kinetic_w")]:
        with pytest.raises(ValueError, match=match):
            her.trajectory_energy(positions(3), DT, **kwargs)


def test_a_priority_that_overflows_is_refused_when_the_episode_enters():
    storage = goal_storage(100, 5)
    her.EnergySampler(DT, clip_energy=1e300, exponent=10.0).attach(storage)
    with pytest.raises(ValueError, match="overflows"):
        add(storage, positions(5, [0, 0, 1e16]))  # a kinetic energy of 3e34 per step, to the 10th power


def test_goals_without_a_position_are_refused():
    storage = her.EpisodeStorage(100, (2,), (1,), (2,), max_episode_steps=5)
    with pytest.raises(ValueError, match="3-D position"):
        her.EnergySampler(DT).attach(storage)


def test_episodes_are_drawn_in_proportion_to_their_energy_and_uniformly_within():
    T = 5
    storage = goal_storage(1000, T)
    sampler = her.EnergySampler(DT, eps=0.01)
    still = add(storage, positions(T))
    rising = add(storage, positions(T, [0, 0, 0.01]))
    buffer = her.HerReplayBuffer(storage, lambda ag, dg, info: np.zeros(len(ag), np.float32), sampler=sampler,
                                 n_sampled_goal=0, seed=0)
    assert not buffer.prioritized
    e_rise = her.trajectory_energy(positions(T, [0, 0, 0.01]), DT)
    p_rise = (e_rise + 0.01) / (e_rise + 0.02)
    counts = np.zeros(2 * (T + 1), int)
    rng = np.random.default_rng(0)
    for _ in range(200):
        slots, weights = sampler.sample(storage, 64, rng)
        assert np.all(weights == 1.0) and np.all(storage.is_transition(slots))
        np.add.at(counts, slots, 1)
    in_rising = counts[rising:rising + T].sum()
    n = counts.sum()
    assert stats.binomtest(int(in_rising), int(n), p_rise).pvalue > 1e-4
    assert counts[still:still + T].sum() > 0  # eps keeps the still episode sampleable
    assert stats.chisquare(counts[rising:rising + T]).pvalue > 1e-4  # uniform within the episode
    assert len(buffer.sample(32).reward) == 32
    with pytest.raises(ValueError, match="EnergySampler"):
        buffer.update_priorities(slots[:2], np.ones(2))


def test_kinetic_weight_scales_the_kinetic_term_and_exponent_sharpens_the_episode_shares():
    # a slide gains only kinetic energy, a rise both: weight 0 leaves the slide at 0 and the rise its potential part
    slide, rise = positions(10, [0.01, 0, 0]), positions(10, [0, 0, 0.01])
    assert her.trajectory_energy(slide, DT, kinetic_weight=0.0) == 0.0
    assert her.trajectory_energy(slide, DT, kinetic_weight=0.2) == pytest.approx(0.2 * 0.5 * (0.01 / DT) ** 2)
    assert her.trajectory_energy(rise, DT, kinetic_weight=0.0) == pytest.approx(10 * G * 0.01)
    T = 5
    storage = goal_storage(100, T)
    sampler = her.EnergySampler(DT, eps=0.01, kinetic_weight=0.5, exponent=2.0)
    sampler.attach(storage)
    paths = [positions(T), positions(T, [0.01, 0, 0]), positions(T, [0, 0, 0.01])]
    starts = [add(storage, p) for p in paths]
    stored = np.stack(paths).astype(np.float32)
    expect = (her.trajectory_energy(stored, DT, kinetic_weight=0.5) + 0.01) ** 2 / T
    for start, e in zip(starts, expect):
        np.testing.assert_allclose(sampler.priorities(np.arange(start, start + T)), e, rtol=1e-9)
    # the rising episode's share of the draws grows with the exponent
    flat = her.EnergySampler(DT, eps=0.01, kinetic_weight=0.5)
    flat.attach(storage)
    rows = np.arange(starts[2], starts[2] + T)
    share = sampler.priorities(rows).sum() / sampler.sum_tree.total
    assert share > flat.priorities(rows).sum() / flat.sum_tree.total
    assert "exponent=2.0" in repr(sampler)


def test_evicted_episodes_leave_and_a_reloaded_storage_gets_the_same_priorities():
    T = 4
    storage = goal_storage(3 * T, T)  # room for three episodes
    sampler = her.EnergySampler(DT)
    sampler.attach(storage)
    for k in range(5):
        add(storage, positions(T, [0, 0, 0.002 * k]))
    assert storage.n_episodes == 3
    slots = storage.transition_slots()
    before = sampler.priorities(slots)
    assert np.all(before > 0) and sampler.sum_tree.total == pytest.approx(before.sum())
    # the energies of the three live episodes (k = 2, 3, 4), per transition
    stored = np.stack([positions(T, [0, 0, 0.002 * k]) for k in (2, 3, 4)]).astype(np.float32)  # as stored
    expect = np.repeat(her.trajectory_energy(stored, DT) + 0.01, T) / T
    np.testing.assert_allclose(before, expect, rtol=1e-9)
    fresh = goal_storage(3 * T, T)
    other = her.EnergySampler(DT)
    other.attach(fresh)
    fresh.load_state_dict(storage.state_dict())
    np.testing.assert_allclose(other.priorities(fresh.transition_slots()), before)
    assert other.sum_tree.total == pytest.approx(sampler.sum_tree.total)


def test_config_keys_name_the_energy_settings():
    with pytest.raises(ValueError, match=r"^replay.energy_eps must be a finite number > 0, got 0.0"):
        check_replay(ReplayConfig(energy=True, energy_eps=0.0), 0.98)
    with pytest.raises(ValueError, match=r"^replay.energy_clip must be a finite number > 0"):
        check_replay(ReplayConfig(energy=True, energy_clip=-1.0), 0.98)
    with pytest.raises(ValueError, match=r"^replay.energy_kinetic_weight must be a finite number >= 0, got -1.0"):
        check_replay(ReplayConfig(energy=True, energy_kinetic_weight=-1.0), 0.98)
    with pytest.raises(ValueError, match=r"^replay.energy_exponent must be a number in \(0, 10\], got 0.0"):
        check_replay(ReplayConfig(energy=True, energy_exponent=0.0), 0.98)
    with pytest.raises(ValueError, match="replay.prioritized: false"):
        check_replay(ReplayConfig(energy=True, prioritized=True), 0.98)
    check_replay(ReplayConfig(energy=True), 0.98)
