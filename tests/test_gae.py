import torch

from llmrl.algos.distilled_ppo import gae


def test_gae_lambda_one_is_monte_carlo_and_dones_cut_bootstrap():
    rewards = torch.tensor([[1.0], [0.0], [2.0], [1.0]])
    values = torch.tensor([[0.5], [0.2], [0.1], [0.3]])
    dones = torch.tensor([[0.0], [1.0], [0.0], [0.0]])  # episode ends after step 1
    last = torch.tensor([4.0])
    adv, ret = gae(rewards, values, dones, last, gamma=0.9, lam=1.0)
    # Steps 0-1: MC return of a finished episode; steps 2-3: bootstrapped from last_value.
    expected = torch.tensor([[1.0 + 0.9 * 0.0], [0.0], [2.0 + 0.9 * 1.0 + 0.81 * 4.0], [1.0 + 0.9 * 4.0]])
    torch.testing.assert_close(ret, expected)
    torch.testing.assert_close(adv, expected - values)


def test_gae_lambda_zero_is_td_error():
    rewards = torch.tensor([[1.0], [1.0]])
    values = torch.tensor([[0.5], [0.25]])
    adv, _ = gae(rewards, values, torch.zeros(2, 1), torch.tensor([2.0]), gamma=0.5, lam=0.0)
    torch.testing.assert_close(adv, torch.tensor([[1.0 + 0.5 * 0.25 - 0.5], [1.0 + 0.5 * 2.0 - 0.25]]))
