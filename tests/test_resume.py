"""torch_dataset: each rank's share in order, resumed exactly.

The expected stream is ``RowReader.shard`` (checked against data/ROWS.md in test_reading.py).
torchdata's ``StatefulDataLoader`` runs where torchdata is installed; elsewhere
``RoundRobinLoader`` plays its part (one state per worker, round-robin over the workers, as
torchdata 0.11's stateful_dataloader.py does). Needs torch: skipped where it is absent.
"""

import json
import pickle

import pyarrow.parquet as pq
import pytest

from builders.rows import RowReader
from helpers import write_random_rows

torch = pytest.importorskip("torch", reason="torch is optional and not installed")
from builders.training import dataset as dataset_module  # noqa: E402
from builders.training.dataset import torch_dataset  # noqa: E402

SEED, WINDOW, EPOCHS = 7, 2, 2


@pytest.fixture(scope="module")
def rows_40(tmp_path_factory):
    """40 rows of 16 tokens in row groups of 8."""
    folder = tmp_path_factory.mktemp("resume")
    written = write_random_rows(folder / "written.parquet", 40)
    path = folder / "rows.parquet"
    pq.write_table(pq.read_table(written), path, row_group_size=8)
    return path


def make(path, rank=0, world_size=1, batch_size=4, **options):
    return torch_dataset(
        path,
        rank,
        world_size,
        seed=SEED,
        batch_size=batch_size,
        window_groups=WINDOW,
        **options,
    )


def expected_batches(path, rank, world_size, batch_size, start=0) -> list:
    """(epoch, row indices) of each batch: the rank's share cut into batches."""
    out = []
    for epoch in range(EPOCHS):
        share = RowReader(path).shard(
            start if epoch == 0 else 0,
            rank,
            world_size,
            seed=SEED,
            epoch=epoch,
            window_groups=WINDOW,
        )
        out += [
            (epoch, share[i : i + batch_size].tolist()) for i in range(0, len(share), batch_size)
        ]
    return out


class RoundRobinLoader:
    """torchdata's StatefulDataLoader over worker copies, in this process.

    Each worker has its own copy of the dataset (pickled, as a worker process gets it); batches
    come from the workers in turn; ``state_dict()`` holds each worker's state as of its last
    yielded batch.
    """

    def __init__(self, dataset, workers, batch_size):
        self.dataset, self.workers, self.batch_size = dataset, workers, batch_size
        self._loaded = None

    def state_dict(self):
        return json.loads(json.dumps(self._state))

    def load_state_dict(self, state):
        self._loaded = state

    def __iter__(self):
        copies = [pickle.loads(pickle.dumps(self.dataset)) for _ in range(self.workers)]
        loaded, self._loaded = self._loaded, None
        self._state = {"workers": [c.state_dict() for c in copies], "last": -1}
        if loaded is not None:
            for copy, state in zip(copies, loaded["workers"], strict=True):
                copy.load_state_dict(state)
            self._state = loaded
        iterators = [iter(c) for c in copies]
        active, turn = list(range(self.workers)), (self._state["last"] + 1) % self.workers
        while active:
            worker = turn if turn in active else active[0]
            batch = self._next_batch(iterators[worker], worker)
            if not batch:
                position = active.index(worker)
                active.remove(worker)
                turn = active[position % len(active)] if active else 0
                continue
            self._state["workers"][worker] = copies[worker].state_dict()
            self._state["last"] = worker
            yield torch.utils.data.default_collate(batch)
            turn = active[(active.index(worker) + 1) % len(active)]

    def _next_batch(self, rows, worker):
        info = type("WorkerInfo", (), {"id": worker, "num_workers": self.workers})()
        original = dataset_module.get_worker_info
        dataset_module.get_worker_info = lambda: info
        try:
            return [row for _, row in zip(range(self.batch_size), rows, strict=False)]
        finally:
            dataset_module.get_worker_info = original


def run_epochs(loader, dataset, first_epoch=0, stop_after=None, resumed=None):
    """(epoch, indices) of each batch from ``first_epoch`` on.

    ``resumed``: the loader was resumed (its epoch set).
    """
    out = []
    for epoch in range(first_epoch, EPOCHS):
        if resumed is None or epoch > first_epoch:
            dataset.set_epoch(epoch)
        for batch in loader:
            out.append((epoch, batch["index"].tolist()))
            if len(out) == stop_after:
                return out
    return out


def resumed_at_every_step(path, loader_class, workers, world_size, batch_size):
    rank = world_size - 1
    expected = expected_batches(path, rank, world_size, batch_size)
    dataset = make(path, rank, world_size, batch_size)
    loader = loader_class(dataset, batch_size=batch_size, num_workers=workers)
    assert run_epochs(loader, dataset) == expected
    for step in range(1, len(expected)):
        dataset = make(path, rank, world_size, batch_size)
        loader = loader_class(dataset, batch_size=batch_size, num_workers=workers)
        head = run_epochs(loader, dataset, stop_after=step)
        state = json.loads(json.dumps(loader.state_dict()))
        del loader
        epoch = head[-1][0]
        dataset = make(path, rank, world_size, batch_size)
        dataset.set_epoch(epoch)
        loader = loader_class(dataset, batch_size=batch_size, num_workers=workers)
        loader.load_state_dict(state)
        tail = run_epochs(loader, dataset, first_epoch=epoch, resumed=True)
        assert head + tail == expected, f"resumed after step {step}"


@pytest.mark.parametrize(
    "workers, world_size, batch_size", [(1, 1, 4), (2, 1, 4), (3, 1, 3), (2, 3, 2), (3, 2, 5)]
)
def test_the_stateful_protocol_resumes_at_every_step(rows_40, workers, world_size, batch_size):
    def loader_class(dataset, batch_size, num_workers):
        return RoundRobinLoader(dataset, num_workers, batch_size)

    resumed_at_every_step(rows_40, loader_class, workers, world_size, batch_size)


def test_torchdatas_stateful_loader_resumes_at_every_step(rows_40):
    stateful = pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata is absent")
    resumed_at_every_step(rows_40, stateful.StatefulDataLoader, 2, 2, 3)
    resumed_at_every_step(rows_40, stateful.StatefulDataLoader, 0, 1, 4)


@pytest.mark.parametrize("workers, world_size, batch_size", [(0, 1, 4), (2, 1, 4), (3, 2, 3)])
def test_the_loader_yields_the_ranks_share_in_order(rows_40, workers, world_size, batch_size):
    for rank in range(world_size):
        dataset = make(rows_40, rank, world_size, batch_size)
        loader = torch.utils.data.DataLoader(
            dataset, batch_size=batch_size, num_workers=workers, persistent_workers=workers > 0
        )
        # persistent workers see set_epoch
        assert run_epochs(loader, dataset) == expected_batches(
            rows_40, rank, world_size, batch_size
        )
        assert len(dataset) == 40 // world_size


def test_another_worker_count_resumes_by_start(rows_40):
    """Another worker count resumes at a position.

    After k batches a rank has consumed k * B rows, the ranks k * B * ws positions.
    """
    world_size, batch_size, steps = 2, 3, 4
    for rank in range(world_size):
        whole = expected_batches(rows_40, rank, world_size, batch_size)
        for workers in (0, 3):
            dataset = make(rows_40, rank, world_size, batch_size, start=steps * batch_size * 2)
            loader = torch.utils.data.DataLoader(
                dataset, batch_size=batch_size, num_workers=workers
            )
            assert run_epochs(loader, dataset, stop_after=3) == whole[steps : steps + 3]


def test_a_state_of_another_stream_is_refused(rows_40):
    state = make(rows_40, batch_size=4).state_dict()
    assert state["worker"] is None and state["yielded"] == 0
    for other, field in [
        (make(rows_40, batch_size=2), "batch_size"),
        (make(rows_40, 1, 2, batch_size=4), "rank"),
        (torch_dataset(rows_40, seed=8, batch_size=4, window_groups=WINDOW), "seed"),
    ]:
        with pytest.raises(ValueError, match=f"its {field} is"):
            other.load_state_dict(state)
    with pytest.raises(ValueError, match="not a state of a fixed-SFT row dataset"):
        make(rows_40).load_state_dict({"epoch": 0})
    started = {**state, "worker": 1, "workers": 2, "yielded": 4}
    dataset = make(rows_40, batch_size=4)
    dataset.load_state_dict(started)
    with pytest.raises(ValueError, match="worker 1 of 2, this is worker 0 of 1"):
        next(iter(dataset))


def test_boundaries_come_as_tensors(rows_40):
    dataset = make(rows_40, boundaries=True)
    row = next(iter(dataset))
    reader_row = next(RowReader(rows_40).rows(seed=SEED, window_groups=WINDOW, boundaries=True))
    assert row["index"] == reader_row["index"]
    for key in ("input_ids", "loss_mask", "position_ids", "seq_lengths"):
        assert row[key].dtype == torch.int64 and row[key].tolist() == reader_row[key].tolist()
