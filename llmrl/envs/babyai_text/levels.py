"""The levels behind the ``BabyAI-Text-*`` ids: GLAM's mixed train/test level (``MixedLocal``, with its held-out
object combinations) and the BabyAI levels served in text (``LEVELS``)."""

from __future__ import annotations

from minigrid.envs.babyai.core.roomgrid_level import RejectSampling, RoomGridLevel
from minigrid.envs.babyai.core.verifier import (
    AfterInstr,
    BeforeInstr,
    GoToInstr,
    ObjDesc,
    OpenInstr,
    PickupInstr,
    PutNextInstr,
)

__all__ = ["HELD_OUT", "TASKS", "MixedLocal", "LEVELS"]

# colour-object combinations the train split never names in a mission and the test split always names
HELD_OUT = ("yellow box", "red key", "red door", "green ball", "grey door")

TASKS = ("goto", "pickup", "open", "putnext", "pickup_then_goto")
_OBJ_COMBOS = [(t, c) for t in ("key", "ball", "box") for c in ("red", "green", "blue", "purple", "yellow", "grey")]


class MixedLocal(RoomGridLevel):
    """GLAM's mixed level: go to / pick up / open / put next to / pick up A then go to B in one 8x8 room.

    The grid holds two rooms side by side; only *open* connects them (a locked door whose key lies in the
    agent's room), so every other task is a single closed room, as in the original. ``split="train"`` never
    names a held-out combination (``HELD_OUT``) in the mission; ``split="test"`` always names one.
    """

    def __init__(self, split: str = "train", num_dists: int = 8, room_size: int = 8, **kwargs):
        if split not in ("train", "test"):
            raise ValueError(f"MixedLocal: split must be 'train' or 'test', got {split!r}")
        self.split, self.num_dists = split, num_dists
        super().__init__(room_size=room_size, num_rows=1, num_cols=2, **kwargs)

    def _combo_ok(self, combos: list[str]) -> bool:
        held = any(c in HELD_OUT for c in combos)
        return held if self.split == "test" else not held

    def _pick_combo(self, held_out: bool | None = None) -> tuple[str, str]:
        pool = [tc for tc in _OBJ_COMBOS if held_out is None or (f"{tc[1]} {tc[0]}" in HELD_OUT) == held_out]
        return self._rand_elem(pool)

    def gen_mission(self):
        task = self._rand_elem(TASKS)
        self.task = task
        if task == "open":
            colors = ["red", "grey"] if self.split == "test" else ["green", "blue", "purple", "yellow"]
            color = self._rand_elem(colors)
            self.add_door(0, 0, 0, color=color, locked=True)
            self.add_object(0, 0, "key", color)
            self.add_distractors(0, 0, num_distractors=self.num_dists, all_unique=False)
            self.place_agent(0, 0)
            named = color if self.split == "test" else self._rand_elem([None, color])
            self.instrs = OpenInstr(ObjDesc("door", named))
        else:
            n_targets = 2 if task in ("putnext", "pickup_then_goto") else 1
            if self.split == "test":  # at least one held-out combination, the other free
                combos = [self._pick_combo(True)] + [self._pick_combo() for _ in range(n_targets - 1)]
                if n_targets == 2 and self._rand_bool():
                    combos.reverse()
            else:
                combos = [self._pick_combo(False) for _ in range(n_targets)]
            if n_targets == 2 and combos[0] == combos[1]:
                raise RejectSampling("the two objects of a two-object task must differ")
            objs = [self.add_object(0, 0, t, c)[0] for t, c in combos]
            self.add_distractors(0, 0, num_distractors=self.num_dists + 1 - n_targets, all_unique=False)
            self.place_agent(0, 0)
            descs = [ObjDesc(o.type, o.color) for o in objs]
            if task == "goto":
                self.instrs = GoToInstr(descs[0])
            elif task == "pickup":
                self.instrs = PickupInstr(descs[0])
            elif task == "putnext":
                self.instrs = PutNextInstr(descs[0], descs[1])
            elif self._rand_bool():
                self.instrs = BeforeInstr(PickupInstr(descs[0]), GoToInstr(descs[1]))
            else:
                self.instrs = AfterInstr(GoToInstr(descs[1]), PickupInstr(descs[0]))
        self.check_objs_reachable()
        mission = self.instrs.surface(self)
        if not self._combo_ok([h for h in HELD_OUT if h in mission]):
            raise RejectSampling(f"mission {mission!r} is outside the {self.split} split")

    def reset(self, **kwargs):
        obs = super().reset(**kwargs)
        if not self.fixed_max_steps:  # one room's navigation budget per sub-goal (the second room is closed)
            self.max_steps = self.room_size ** 2 * self.num_navs_needed(self.instrs) * (2 if self.task == "open"
                                                                                          else 1)
        return obs


# text id -> underlying level (a BabyAI id, or a MixedLocal split)
LEVELS = {
    "BabyAI-Text-MixedTrainLocal-v0": "train",
    "BabyAI-Text-MixedTestLocal-v0": "test",
    "BabyAI-Text-GoToRedBallNoDists-v0": "BabyAI-GoToRedBallNoDists-v0",
    "BabyAI-Text-GoToObjS4-v0": "BabyAI-GoToObjS4-v0",
    "BabyAI-Text-GoToLocal-v0": "BabyAI-GoToLocal-v0",
    "BabyAI-Text-PickupLoc-v0": "BabyAI-PickupLoc-v0",
    "BabyAI-Text-KeyCorridorS3R1-v0": "BabyAI-KeyCorridorS3R1-v0",
    "BabyAI-Text-GoToSeqS5R2-v0": "BabyAI-GoToSeqS5R2-v0",
}
