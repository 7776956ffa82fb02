"""trainer/learners/advantages.py against advantages computed by hand, on rows interleaved as the bridge's fragments are."""
import numpy as np
import pytest

from simbridge.trainer.learners.advantages import compute_advantages, segments

G, L = 0.9, 0.5


def fragment():
    """Three segments, their rows interleaved and out of order:
    - episode 7, agent 0, t 0..2, terminated at t 2 (last_r = 0);
    - episode 8, agent 1, t 4..5, cut by the fragment's end (last_r = V(new_obs) of t 5 = 10);
    - episode 9, agent 0, t 0..1, truncated at t 1 (last_r = V(new_obs) = 20).
    Each row: (eps_id, agent_index, t, reward, V(obs), V(new_obs), terminated, truncated)."""
    rows = [
        (8, 1, 5, 3.0, 2.0, 10.0, False, False),
        (7, 0, 0, 1.0, 0.5, 0.25, False, False),
        (9, 0, 1, -1.0, 4.0, 20.0, False, True),
        (7, 0, 2, 2.0, 1.0, 99.0, True, False),    # V(new_obs) of a terminal row is never read
        (8, 1, 4, 0.0, 3.0, 2.0, False, False),
        (7, 0, 1, 0.0, 0.25, 1.0, False, False),
        (9, 0, 0, 5.0, 6.0, 4.0, False, False),
    ]
    cols = [np.array(c) for c in zip(*rows)]
    return dict(zip(["eps_id", "agent_index", "t", "r", "v", "v_next", "term", "trunc"], cols))


def run(use_gae):
    f = fragment()
    order, ends = segments(f["eps_id"], f["agent_index"], f["t"], f["term"] | f["trunc"])
    adv, targets = compute_advantages(f["r"][order], f["v"][order], f["v_next"][order], f["term"][order], ends,
                                      G, L, use_gae)
    by_row = {(int(f["eps_id"][i]), int(f["t"][i])): (float(a), float(y))
              for i, a, y in zip(order, adv, targets)}
    return by_row


def test_segments_sort_each_agents_rows_by_t_and_mark_their_ends():
    f = fragment()
    order, ends = segments(f["eps_id"], f["agent_index"], f["t"], f["term"] | f["trunc"])
    assert [(int(f["eps_id"][i]), int(f["t"][i])) for i in order] == [(7, 0), (7, 1), (7, 2), (8, 4), (8, 5),
                                                                      (9, 0), (9, 1)]
    assert ends.tolist() == [False, False, True, False, True, False, True]


def test_a_gap_in_t_or_another_agent_of_the_same_episode_starts_a_new_segment():
    order, ends = segments(np.array([1, 1, 1, 1]), np.array([0, 0, 0, 1]), np.array([0, 1, 3, 2]),
                           np.zeros(4, bool))
    assert ends.tolist() == [False, True, True, True]    # t 1 -> 3 is a gap (a row was dropped)


def test_gae_equals_the_hand_computed_values_for_terminated_truncated_and_cut_segments():
    got = run(use_gae=True)
    # episode 7, terminated at t 2: deltas with V(s_3) = 0
    d2 = 2.0 + 0.0 - 1.0                 # 1.0
    d1 = 0.0 + G * 1.0 - 0.25            # 0.65
    d0 = 1.0 + G * 0.25 - 0.5            # 0.725
    a2, a1 = d2, d1 + G * L * d2
    a0 = d0 + G * L * a1
    # episode 8, cut by the fragment's end: bootstrap V(new_obs of t 5) = 10
    e5 = 3.0 + G * 10.0 - 2.0            # 10.0
    e4 = 0.0 + G * 2.0 - 3.0             # -1.2
    b5, b4 = e5, e4 + G * L * e5
    # episode 9, truncated at t 1: bootstrap V(new_obs) = 20, not 0
    f1 = -1.0 + G * 20.0 - 4.0           # 13.0
    f0 = 5.0 + G * 4.0 - 6.0             # 2.6
    c1, c0 = f1, f0 + G * L * f1
    expected = {(7, 0): (a0, 0.5), (7, 1): (a1, 0.25), (7, 2): (a2, 1.0), (8, 4): (b4, 3.0), (8, 5): (b5, 2.0),
                (9, 0): (c0, 6.0), (9, 1): (c1, 4.0)}
    for key, (adv, v) in expected.items():
        assert got[key][0] == pytest.approx(adv, abs=1e-5), key
        assert got[key][1] == pytest.approx(adv + v, abs=1e-5), key      # value target = advantage + V


def test_without_gae_targets_are_discounted_returns_with_the_same_bootstraps():
    got = run(use_gae=False)
    expected_returns = {
        (7, 2): 2.0, (7, 1): 0.0 + G * 2.0, (7, 0): 1.0 + G * (G * 2.0),
        (8, 5): 3.0 + G * 10.0, (8, 4): 0.0 + G * (3.0 + G * 10.0),
        (9, 1): -1.0 + G * 20.0, (9, 0): 5.0 + G * (-1.0 + G * 20.0),
    }
    values = {(7, 0): 0.5, (7, 1): 0.25, (7, 2): 1.0, (8, 4): 3.0, (8, 5): 2.0, (9, 0): 6.0, (9, 1): 4.0}
    for key, ret in expected_returns.items():
        assert got[key][1] == pytest.approx(ret, abs=1e-5), key
        assert got[key][0] == pytest.approx(ret - values[key], abs=1e-5), key


def test_lambda_one_gae_equals_the_discounted_return_minus_v():
    f = fragment()
    order, ends = segments(f["eps_id"], f["agent_index"], f["t"], f["term"] | f["trunc"])
    args = (f["r"][order], f["v"][order], f["v_next"][order], f["term"][order], ends, G)
    adv_gae, y_gae = compute_advantages(*args, lambda_=1.0, use_gae=True)
    adv_mc, y_mc = compute_advantages(*args, lambda_=1.0, use_gae=False)
    # equal only where V(new_obs_t) = V(obs_t+1) inside segments, as the fragment is built
    np.testing.assert_allclose(adv_gae, adv_mc, atol=1e-5)
    np.testing.assert_allclose(y_gae, y_mc, atol=1e-5)
