"""The memory manager's contract (models.memory): pages promised, taken, shared with reference counts
and given back; kept prompts; a fork's shared full pages and copied last one; state slots copied,
forked and snapshotted; a step's view writing each row's keys where they go and reading the pages
back."""
import numpy as np
import pytest

from silkattn.models.family import FamilyConfig
from silkattn.models.memory import Memory

CONFIG = FamilyConfig(vocab=10, d=8, n_layers=2, h=2, h_kv=1, d_ff=8)  # d_head 4


def test_pages_are_shared_with_reference_counts_and_free_at_the_last():
    mem = Memory(CONFIG, tokens=4 * 8, page_keys=8)
    assert mem.pages == 4 and mem.free == 4 and mem.reserve(3) and not mem.reserve(2)
    a = [mem.take(), mem.take()]
    mem.share(a)  # a second reader
    assert list(mem.refs[a]) == [2, 2] and mem.free == 1
    mem.give(a)
    assert list(mem.refs[a]) == [1, 1] and mem.free == 1  # still read by the other
    mem.give(a, unused=1)
    assert mem.refs.sum() == 0 and mem.free == 4 and mem.reserved == 0
    with pytest.raises(ValueError, match="taken"):
        mem.share(a)
    with pytest.raises(RuntimeError, match="reserved"):
        mem.take()


def test_a_prompt_s_pages_are_kept_with_its_tokens_until_needed():
    mem = Memory(CONFIG, tokens=3 * 8, page_keys=8)
    mem.reserve(2)
    pages, ids = [mem.take(), mem.take()], np.arange(10)
    mem.give(pages, ids=ids)  # 10 positions: both pages hold the prompt
    assert [(list(k), p) for k, p in mem.kept] == [(list(ids), pages)] and mem.free == 3
    mem.reserve(3)
    taken = [mem.take() for _ in range(3)]  # the third takes a kept page: the entry is evicted
    assert mem.kept == [] and sorted(taken) == [0, 1, 2]


def test_a_fork_shares_the_full_pages_and_copies_the_last():
    mem = Memory(CONFIG, tokens=6 * 8, page_keys=8)
    mem.reserve(4)
    pages = [mem.take() for _ in range(3)]
    mem.data[...] = np.arange(mem.data.size, dtype=np.float32).reshape(mem.data.shape)
    fork = mem.fork(pages, 19)  # two full pages and 3 positions of the third
    assert fork[:2] == pages[:2] and fork[2] not in pages and list(mem.refs[pages]) == [2, 2, 1]
    np.testing.assert_array_equal(mem.data[:, :, fork[2], :, :3], mem.data[:, :, pages[2], :, :3])
    mem.give(pages)
    mem.give(fork)
    assert mem.free == 6


def test_state_slots_are_copied_forked_and_snapshotted():
    mem = Memory(CONFIG, tokens=8, page_keys=8, states={"conv": (2, 3), "delta": (4, 4)}, slots=3)
    a = mem.slot()
    mem.states["conv"][a], mem.states["delta"][a] = 1.5, -2.0
    b = mem.fork_slot(a)
    snap = mem.snapshot(a)
    mem.states["conv"][a] = 7.0  # a goes on; its fork and snapshot keep what it held
    assert (mem.states["conv"][b] == 1.5).all() and (mem.states["delta"][snap] == -2.0).all()
    with pytest.raises(RuntimeError, match="slot"):
        mem.slot()
    mem.free_slot(b)
    assert (mem.states["conv"][mem.slot()] == 0).all()  # a slot handed out is zeroed
    mem.copy_slot(a, snap)
    assert (mem.states["conv"][snap] == 7.0).all()
    assert mem.nbytes == mem.data.nbytes + 3 * (6 + 16) * 4


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_a_view_writes_each_row_where_its_position_goes(dtype):
    mem = Memory(CONFIG, tokens=5 * 4, page_keys=4, dtype=dtype)
    mem.reserve(5)
    tables = [[mem.take(), mem.take()], [mem.take()]]
    view = mem.view(tables, [5, 2])
    assert view.tables.tolist() == [tables[0], [tables[1][0], 0]] and view.lengths.tolist() == [6, 3]
    assert view.page.tolist() == [tables[0][1], tables[1][0]] and view.slot.tolist() == [1, 2]
    k = np.arange(2 * 4, dtype=np.float32).reshape(1, 2, 4) + 0.25
    view.write(1, k, -k)
    K, V, read = view.read(1)
    assert K.dtype == np.float32
    for row in range(2):  # each row's keys read back through the view's tables, where they were written
        page = read[row, view.lengths[row] // 4 if view.lengths[row] % 4 else view.lengths[row] // 4 - 1]
        np.testing.assert_array_equal(K[page, :, view.slot[row]], k[:, row])
        np.testing.assert_array_equal(V[page, :, view.slot[row]], -k[:, row])


def test_a_packed_view_holds_each_prompt_s_positions_in_its_pages():
    """A prefill's view: a row for every position of every prompt, written to its prompt's pages,
    copied between rows, read back all together and one prompt at a time."""
    mem = Memory(CONFIG, tokens=6 * 4, page_keys=4)
    mem.reserve(3)
    tables = [[mem.take(), mem.take()], [mem.take()]]
    view = mem.packed(tables, [6, 3])
    assert view.page.tolist() == [tables[0][0]] * 4 + [tables[0][1]] * 2 + [tables[1][0]] * 3
    assert view.slot.tolist() == [0, 1, 2, 3, 0, 1, 0, 1, 2]
    k = np.arange(9 * 4, dtype=np.float32).reshape(1, 9, 4)
    own = np.array([0, 1, 2, 3, 4, 5, 8])
    view.write(0, k[:, own], -k[:, own], own)
    view.copy(0, np.array([6, 7]), view.page[:2], view.slot[:2])  # the second prompt's first two: the first's
    K, V = view.gather(0)
    expected = k.copy()
    expected[:, 6:8] = k[:, :2]
    np.testing.assert_array_equal(K, expected)
    np.testing.assert_array_equal(V, -expected)
    Kb, Vb = view.keys(0, 1)
    np.testing.assert_array_equal(Kb, expected[:, 6:])
    np.testing.assert_array_equal(view.keys(0, 0)[1], -expected[:, :6])
