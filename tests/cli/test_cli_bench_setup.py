"""`oncelog bench`: what its figures measure and how their setup is built, not their speed.

- memory per producer is the resident growth of a filled producer table: at least
  the row each producer is written to, and a measurement that missed the table's
  pages fails loudly instead of reporting a few bytes;
- the partition-open figures clone one partition image into many roots: clones hold
  the image's bytes, share only the files the engine never writes, open in the
  state the figure is named for, and a write to a shared file is caught.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from oncelog.bench import manager as bench_manager
from oncelog.bench import recovery as bench_recovery
from oncelog.producer_state import PRODUCER_DTYPE, ProducerStateEntry, ProducerStateManager
from oncelog.storage.log_dirs import LEGACY_LOCK_FILE

PRODUCERS = 20_000
PARTITIONS = 3


class TestMemoryPerProducer:
    def test_it_counts_every_row_written_and_the_pid_map(self) -> None:
        rows = bench_recovery.producer_table_rows(PRODUCERS, expired_fraction=0.0)
        per_producer = bench_recovery.resident_bytes_per_producer(rows)
        # The row at least (with its due time and pid map entry: 184 B); nothing near double.
        assert PRODUCER_DTYPE.itemsize <= per_producer < 2 * PRODUCER_DTYPE.itemsize

    def test_a_table_whose_pages_were_never_written_fails_loudly(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        class Untouched(ProducerStateManager):
            """Claims every producer but writes no row: the 0.0077 B per producer of old."""

            def load_rows(self, rows: object, now_ms: int | None = None) -> None:
                pass

            def __len__(self) -> int:
                return self.capacity

            def get(self, producer_id: int) -> ProducerStateEntry | None:
                return ProducerStateEntry(producer_id, 0, -1, -1, 0, ())

        monkeypatch.setattr(bench_recovery, "ProducerStateManager", Untouched)
        rows = bench_recovery.producer_table_rows(PRODUCERS, expired_fraction=0.0)
        with pytest.raises(AssertionError, match="missed pages"):
            bench_recovery.resident_bytes_per_producer(rows)


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bench_manager.PartitionImage]:
    directory = tmp_path_factory.mktemp("images")
    unclean, clean = str(directory / "image"), str(directory / "clean-image")
    bench_manager.unclean_image(unclean)
    bench_manager.clean_image(unclean, clean)
    return {
        "unclean": bench_manager.PartitionImage.read(unclean),
        "clean": bench_manager.PartitionImage.read(clean),
    }


def tree(path: str) -> dict[str, bytes]:
    files = {}
    for folder, _, names in os.walk(path):
        for name in names:
            full = os.path.join(folder, name)
            with open(full, "rb") as file:
                files[os.path.relpath(full, path)] = file.read()
    return files


class TestPartitionRoots:
    @pytest.mark.parametrize("state", ["clean", "unclean"])
    def test_a_clone_holds_the_images_bytes_and_shares_only_read_only_files(
        self, images: dict[str, bench_manager.PartitionImage], tmp_path: Path, state: str
    ) -> None:
        image = images[state]
        clone = str(tmp_path / "clone")
        image.clone(clone)
        # All but the lock file of the Log that wrote the image: a managed partition has none.
        written = {name: data for name, data in tree(image.path).items() if name != LEGACY_LOCK_FILE}
        assert tree(clone) == written
        assert LEGACY_LOCK_FILE in tree(image.path) and LEGACY_LOCK_FILE not in tree(clone)
        assert image.linked, "the sealed segment is shared"
        for name in tree(clone):
            shared = os.path.samefile(os.path.join(clone, name), os.path.join(image.path, name))
            assert shared is (name in image.linked), name
        assert not any(name.startswith((".lock", ".clean_shutdown", "meta.lmdb")) for name in image.linked)

    @pytest.mark.parametrize("state", ["clean", "unclean"])
    def test_every_open_finds_the_state_it_is_timed_for(
        self, images: dict[str, bench_manager.PartitionImage], tmp_path: Path, state: str
    ) -> None:
        root = str(tmp_path / "root")
        bench_manager.build_root(root, images[state], PARTITIONS, root_store=state == "clean")
        opened = bench_manager._time_manager_open(root, state, read_every=2)
        assert opened.elapsed_s > 0 and opened.threads >= 1
        assert opened.idle.descriptors > 0 and opened.idle.resident_bytes >= 0
        if state == "clean":  # a clean open and close leaves it clean
            assert bench_manager._time_sequential_open(root, state) > 0
        images[state].check_unwritten()

    def test_a_clean_root_is_as_a_log_managers_open_and_close_left_it(
        self, images: dict[str, bench_manager.PartitionImage], tmp_path: Path
    ) -> None:
        root = str(tmp_path / "root")
        bench_manager.build_root(root, images["clean"], PARTITIONS, root_store=True)

        def entries() -> set[tuple[str, bool]]:
            return {
                (os.path.relpath(os.path.join(folder, name), root), name in dirs)
                for folder, dirs, files in os.walk(root)
                for name in dirs + files
            }

        built = entries()
        assert (f"{bench_manager.TOPIC}-0/{LEGACY_LOCK_FILE}", True) in built  # the mark, a directory
        bench_manager._time_manager_open(root, "clean")
        # The timed open made nothing a later open would not find made already.
        assert entries() == built

    def test_a_root_in_the_wrong_state_is_refused(
        self, images: dict[str, bench_manager.PartitionImage], tmp_path: Path
    ) -> None:
        root = str(tmp_path / "root")
        bench_manager.build_root(root, images["unclean"], PARTITIONS)
        with pytest.raises(AssertionError, match="opened clean, not clean"):
            bench_manager._time_sequential_open(root, "clean")

    def test_a_write_to_a_shared_file_is_caught(self, tmp_path: Path) -> None:
        bench_manager.unclean_image(str(tmp_path / "image"))  # its own: this test writes to it
        image = bench_manager.PartitionImage.read(str(tmp_path / "image"))
        clone = str(tmp_path / "clone")
        image.clone(clone)
        with open(os.path.join(clone, image.linked[0]), "r+b") as file:
            file.write(b"\x00")  # through the clone's link: the image's inode
            os.utime(file.fileno(), ns=(0, 1))  # a new mtime even where the clock is coarse
        with pytest.raises(AssertionError, match="should only read"):
            image.check_unwritten()
