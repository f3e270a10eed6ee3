"""BabyAI-Text: exact sentences on hand-built grids, every registered level valid and deterministic."""

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from minigrid.core.grid import Grid
from minigrid.core.world_object import Ball, Box, Door, Key, Wall

from llmrl.envs.make import make_env
from llmrl.envs.babyai_text.description import Fact, describe_image
from llmrl.envs.babyai_text.languages import VARIANTS, English
from llmrl.envs.babyai_text.levels import HELD_OUT, LEVELS
from llmrl.envs.babyai_text.missions import parse_mission


def view(cells, carry=None, vis=True):
    """A hand-built 7x7 egocentric view, agent at (3, 6) facing up; ``cells`` maps (x, y) -> object."""
    g = Grid(7, 7)
    for (x, y), obj in cells.items():
        g.set(x, y, obj)
    mask = g.process_vis(agent_pos=(3, 6)) if vis else np.ones((7, 7), dtype=bool)
    if carry is not None:
        g.set(3, 6, carry)
    return g.encode(mask)


def sentences(image, variant="none", order="glam"):
    return [VARIANTS[variant].sentence(f) for f in describe_image(image, order)]


def test_single_room_sentences_exact_in_glam_order():
    """GLAM's description code: carried object, walls, then objects in the view's column scan."""
    cells = {(x, 2): Wall() for x in range(7)}
    cells.update({(0, 6): Wall(), (1, 4): Ball("red"), (5, 5): Key("yellow"), (3, 4): Box("green")})
    assert sentences(view(cells, carry=Key("purple"))) == [
        "You carry a purple key",
        "You see a wall 3 steps left",
        "You see a red ball 2 steps left and 2 steps forward",
        "You see a green box 2 steps forward",
        "You see a yellow key 2 steps right and 1 step forward",
    ]


def test_single_room_sentences_nearest_first_option():
    cells = {(x, 2): Wall() for x in range(7)}
    cells.update({(0, 6): Wall(), (1, 4): Ball("red"), (5, 5): Key("yellow"), (3, 4): Box("green")})
    assert sentences(view(cells, carry=Key("purple")), order="nearest") == [
        "You see a wall 3 steps left",
        "You see a green box 2 steps forward",
        "You see a yellow key 2 steps right and 1 step forward",
        "You see a red ball 2 steps left and 2 steps forward",
        "You carry a purple key",
    ]
    with pytest.raises(ValueError, match="order"):
        describe_image(view(cells), order="random")


def test_walls_on_three_rays_and_doors_with_state():
    cells = {(3, 3): Wall(), (2, 6): Wall(), (6, 6): Wall(), (5, 4): Door("red", is_open=False, is_locked=True),
             (1, 5): Door("blue", is_open=True)}
    assert sentences(view(cells)) == [
        "You see a wall 3 steps forward",
        "You see a wall 1 step left",
        "You see a wall 3 steps right",
        "You see an open blue door 2 steps left and 1 step forward",
        "You see a locked red door 2 steps right and 2 steps forward",
    ]


def test_multi_room_hides_what_is_behind_walls_and_closed_doors():
    # A wall across row 3 with a closed door in the middle: the room beyond is not visible.
    cells = {(x, 3): Wall() for x in range(7) if x != 3}
    cells[(3, 3)] = Door("grey", is_open=False)
    cells[(3, 1)] = Ball("blue")  # in the next room, behind the closed door
    cells[(5, 5)] = Key("red")
    assert sentences(view(cells)) == [
        "You see a closed grey door 3 steps forward",
        "You see a red key 2 steps right and 1 step forward",
    ]
    cells[(3, 3)] = Door("grey", is_open=True)  # opened: the ball beyond becomes visible
    assert "You see a blue ball 5 steps forward" in sentences(view(cells))


def test_variants_and_french_sentences():
    f = Fact("object", "ball", "red", "", -2, 1)
    assert VARIANTS["nouns_renamed"].sentence(f) == "You see a red table 2 steps left and 1 step forward"
    assert VARIANTS["colour_synonyms"].sentence(f) == "You see a crimson ball 2 steps left and 1 step forward"
    assert VARIANTS["invented_nouns_adjectives"].sentence(f) == "You see a faze wug 2 steps left and 1 step forward"
    assert VARIANTS["french"].sentence(f) == "Tu vois une balle rouge 2 pas à gauche et 1 pas en avant"
    assert VARIANTS["french"].sentence(Fact("object", "door", "green", "locked", 0, 3)) == \
        "Tu vois une porte verte verrouillée 3 pas en avant"
    assert VARIANTS["french"].sentence(Fact("carry", "key", "purple")) == "Tu portes une clé violette"
    assert VARIANTS["french"].sentence(Fact("wall", "wall", forward=2)) == "Tu vois un mur 2 pas en avant"


@pytest.mark.parametrize("variant,expected", [
    ("none", "pick up a blue key, then go to the red ball"),
    ("colour_synonyms", "pick up an azure key, then go to the crimson ball"),
    ("rephrased_goals", "grab a blue key, and afterwards reach the red ball"),
    ("french", "ramasse une clé bleue, puis va à la balle rouge"),
])
def test_mission_transforms(variant, expected):
    assert VARIANTS[variant].mission(parse_mission("pick up a blue key, then go to the red ball")) == expected


def test_french_after_and_put_next():
    fr = VARIANTS["french"]
    assert fr.mission(parse_mission("go to the grey box after you pick up a yellow key")) == \
        "va à la boîte grise après avoir ramassé une clé jaune"
    assert fr.mission(parse_mission("put the red ball next to a green box")) == \
        "pose la balle rouge à côté d'une boîte verte"


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="not a BabyAI mission"):
        parse_mission("dance with the red ball")
    with pytest.raises(ValueError, match="unknown variant"):
        make_env("BabyAI-Text-GoToObjS4-v0", variant="klingon")
    with pytest.raises(ValueError, match="7x7x3"):
        describe_image(np.zeros((5, 5, 3)))


@pytest.mark.parametrize("env_id", sorted(LEVELS))
def test_registered_level_passes_check_env_and_is_deterministic(env_id):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_env(gym.make(env_id), skip_render_check=True)

    def rollout(seed):
        env = make_env(env_id, seed=seed)
        rng = np.random.default_rng(0)
        out = []
        for _ in range(2):
            obs, _ = env.reset()
            out.append((obs["mission"], obs["text"]))
            for _ in range(6):
                obs, *_ = env.step(int(rng.integers(6)))
                out.append((obs["mission"], obs["text"]))
        return out

    assert rollout(5) == rollout(5)
    assert rollout(5) != rollout(6)


def test_mixed_levels_hold_out_combinations():
    train, test = make_env("BabyAI-Text-MixedTrainLocal-v0"), make_env("BabyAI-Text-MixedTestLocal-v0")
    tasks = set()
    for seed in range(40):
        m_train = train.reset(seed=seed)[0]["mission"]
        m_test = test.reset(seed=seed)[0]["mission"]
        tasks.add(train.unwrapped.task)
        assert not any(h in m_train for h in HELD_OUT), m_train
        assert any(h in m_test for h in HELD_OUT), m_test
    assert tasks == {"goto", "pickup", "open", "putnext", "pickup_then_goto"}


def test_text_env_is_solvable_by_the_bot():
    from llmrl.agents.baselines import BabyAIBotPolicy
    from llmrl.eval.harness import evaluate

    for env_id in ("BabyAI-Text-MixedTrainLocal-v0", "BabyAI-Text-MixedTestLocal-v0"):
        s = evaluate(BabyAIBotPolicy(), make_env(env_id), range(20), progress=False).summary()
        assert s["success_rate"] == 1.0, env_id


def test_english_is_default_language():
    assert isinstance(VARIANTS["none"], English)
    env = make_env("BabyAI-Text-GoToObjS4-v0", variant="renamed_actions")
    assert env.get_wrapper_attr("action_texts")[0] == "rotate left"
