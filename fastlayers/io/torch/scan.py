"""The pre-scan of a pickle: a walk over its opcodes, before anything is unpickled, that bounds
what unpickling it can build (``scan_pickle``).
"""

from __future__ import annotations

import pickletools

from ... import settings
from ...errors import ModelFileError

# Actions of the scan, by opcode (a table of 256 entries, built from pickletools' opcode list):
(
    _BAD,
    _SCALAR,
    _SCALAR_LEN,
    _SCALAR_LINES,
    _PUT,
    _GET,
    _MEMOIZE,
    _MARK,
    _FROM_MARK,
    _INTO_BELOW_MARK,
    _INTO,
    _POP,
    _POP_MARK,
    _DUP,
    _GENERIC,
    _STOP,
    _NOTHING,
) = range(17)


def _opcode_tables():
    """(action, fixed argument bytes, length-prefix width (negative: signed), lines, objects
    popped, objects pushed, name) per opcode byte, for ``scan_pickle``."""
    action, fixed, width, lines, popped, pushed = ([_BAD] * 256, [0] * 256, [0] * 256, [0] * 256, [0] * 256, [0] * 256)
    names = ["?"] * 256
    special = {
        "BINPUT": _PUT,
        "LONG_BINPUT": _PUT,
        "PUT": _PUT,
        "BINGET": _GET,
        "LONG_BINGET": _GET,
        "GET": _GET,
        "MEMOIZE": _MEMOIZE,
        "MARK": _MARK,
        "TUPLE": _FROM_MARK,
        "LIST": _FROM_MARK,
        "DICT": _FROM_MARK,
        "FROZENSET": _FROM_MARK,
        "INST": _FROM_MARK,
        "OBJ": _FROM_MARK,
        "APPENDS": _INTO_BELOW_MARK,
        "SETITEMS": _INTO_BELOW_MARK,
        "ADDITEMS": _INTO_BELOW_MARK,
        "APPEND": _INTO,
        "BUILD": _INTO,
        "SETITEM": _INTO,
        "POP": _POP,
        "POP_MARK": _POP_MARK,
        "DUP": _DUP,
        "STOP": _STOP,
        "PROTO": _NOTHING,
        "FRAME": _NOTHING,
    }
    for op in pickletools.opcodes:
        code = op.code.encode("latin-1")[0]
        names[code] = op.name
        arg = op.arg
        if arg is not None and arg.n >= 0:
            fixed[code] = arg.n
        elif arg is not None and arg.n == pickletools.UP_TO_NEWLINE:
            lines[code] = 2 if arg.name == "stringnl_noescape_pair" else 1
        elif arg is not None:
            w = {
                pickletools.TAKEN_FROM_ARGUMENT1: 1,
                pickletools.TAKEN_FROM_ARGUMENT4: -4,
                pickletools.TAKEN_FROM_ARGUMENT4U: 4,
                pickletools.TAKEN_FROM_ARGUMENT8U: 8,
            }[arg.n]
            width[code] = w
        popped[code] = len(op.stack_before)
        pushed[code] = len(op.stack_after)
        if op.name in special:
            action[code] = special[op.name]
        elif (
            not op.stack_before
            and len(op.stack_after) == 1
            and op.name not in ("GLOBAL", "EXT1", "EXT2", "EXT4", "PERSID", "EMPTY_LIST", "EMPTY_DICT", "EMPTY_SET")
        ):
            action[code] = _SCALAR_LEN if width[code] else _SCALAR_LINES if lines[code] else _SCALAR
        else:
            action[code] = _GENERIC
    return action, fixed, width, lines, popped, pushed, names


_ACTION, _FIXED, _WIDTH, _LINES, _POPPED, _PUSHED, _NAMES = _opcode_tables()
_ONE = (1, 1)  # the cell of every number, string and constant (nothing is added to those)


def _memo_index(text: bytes, fail) -> int:
    """The memo index of a protocol-0 PUT or GET (decimal text)."""
    try:
        return int(text)
    except ValueError:
        fail(f"memo index {text[:20]!r} is not a number")


def scan_pickle(data, pos: int, source: str, max_nodes: int | None = None, max_depth: int | None = None) -> int:
    """Check the pickle starting at ``data[pos]`` (bytes or an mmap) before it is unpickled:
    every opcode known and whole, every length inside the data, memo indices no larger than the
    position they are stored at (the unpickler's memo is an array that long), and the objects it
    builds within ``torch_max_pickle_nodes`` nodes counted as their expansion (each use of a
    shared object counts its whole size again) and ``torch_max_pickle_depth`` levels of nesting
    (``settings.current()``, unless given). This is what
    makes hashing, comparing and printing what the unpickler builds bounded work. Returns the
    position after the pickle's STOP; raises ``ModelFileError`` naming ``source``."""
    options = settings.current()
    max_nodes = options.torch_max_pickle_nodes if max_nodes is None else max_nodes
    max_depth = options.torch_max_pickle_depth if max_depth is None else max_depth
    action, fixed, width, lines, popped, pushed = _ACTION, _FIXED, _WIDTH, _LINES, _POPPED, _PUSHED
    end = len(data)
    stack: list = []  # one cell [size, depth] per object (the same cell for shared ones)
    append = stack.append
    marks: list = []
    memo: dict = {}
    total = 0

    def fail(what):
        raise ModelFileError(f"{source}: corrupt or hostile pickle: {what}")

    def too_big():
        fail(
            f"it builds objects of more than {max_nodes} nodes or nested more than {max_depth} "
            "deep once its shared references are expanded (the environment variables "
            "FASTLAYERS_TORCH_MAX_PICKLE_NODES and FASTLAYERS_TORCH_MAX_PICKLE_DEPTH raise the "
            "limits)"
        )

    def collect(items):
        size, depth = 1, 0
        for item in items:
            size += item[0]
            if item[1] > depth:
                depth = item[1]
        return size, depth + 1

    def grow(cell, items):
        if type(cell) is not list:
            fail("an item is added to something that is not a container")
        size, depth = collect(items)
        cell[0] += size - 1
        if depth > cell[1]:
            cell[1] = depth
        if cell[0] > max_nodes or cell[1] > max_depth:
            too_big()

    try:
        while True:
            code = data[pos]
            pos += 1
            # the opcodes torch's pickles are made of, first (protocol 2); the rest by the table
            if code == 0x72 or code == 0x71:  # LONG_BINPUT, BINPUT
                if code == 0x71:
                    key = data[pos]
                    pos += 1
                else:
                    key = int.from_bytes(data[pos : pos + 4], "little")
                    pos += 4
                if not stack or key > pos:
                    fail(
                        f"memo store of index {key} at byte {pos} (a pickler numbers its "
                        "objects in order, on a non-empty stack)"
                    )
                memo[key] = stack[-1]
                continue
            if code == 0x68 or code == 0x6A:  # BINGET, LONG_BINGET
                if code == 0x68:
                    key = data[pos]
                    pos += 1
                else:
                    key = int.from_bytes(data[pos : pos + 4], "little")
                    pos += 4
                cell = memo.get(key)
                if cell is None:
                    fail("a memo entry read before it is stored")
                append(cell)
                total += cell[0]
                if total > max_nodes:
                    too_big()
                continue
            if code == 0x4B or code == 0x29 or code == 0x89 or code == 0x88 or code == 0x4E:
                pos += code == 0x4B  # BININT1; EMPTY_TUPLE, NEWFALSE/TRUE, NONE
                append(_ONE)
                total += 1
                continue
            if code == 0x58:  # BINUNICODE
                pos += 4 + int.from_bytes(data[pos : pos + 4], "little")
                if pos > end:
                    fail("BINUNICODE runs past the end of the data")
                append(_ONE)
                total += 1
                continue
            if code == 0x28:  # MARK
                marks.append(len(stack))
                continue
            if code == 0x7D or code == 0x5D:  # EMPTY_DICT, EMPTY_LIST (grown later)
                append([1, 1])
                total += 1
                continue
            if code == 0x74 or code == 0x75:  # TUPLE, SETITEMS: the items above the mark
                if not marks:
                    fail(f"{_NAMES[code]} without a mark")
                k = marks.pop()
                size, depth = 1, 0
                for item in stack[k:]:
                    size += item[0]
                    if item[1] > depth:
                        depth = item[1]
                del stack[k:]
                depth += 1
                if code == 0x74:
                    cell = [size, depth]
                    append(cell)
                    total += size
                else:
                    if not stack or type(stack[-1]) is not list:
                        fail("SETITEMS without a dict")
                    cell = stack[-1]
                    cell[0] += size - 1
                    if depth > cell[1]:
                        cell[1] = depth
                if cell[1] > max_depth or cell[0] > max_nodes or total > max_nodes:
                    too_big()
                continue
            if code == 0x52 or code == 0x85:  # REDUCE (callable, args), TUPLE1
                k = 2 if code == 0x52 else 1
                if len(stack) < k or (marks and marks[-1] > len(stack) - k):
                    fail(f"{_NAMES[code]} on a stack too short")
                if k == 2:
                    a, b = stack[-2], stack[-1]
                    del stack[-2:]
                    cell = [1 + a[0] + b[0], 1 + (a[1] if a[1] > b[1] else b[1])]
                else:
                    a = stack.pop()
                    cell = [1 + a[0], 1 + a[1]]
                if cell[1] > max_depth:
                    too_big()
                append(cell)
                total += cell[0]
                if total > max_nodes:
                    too_big()
                continue
            act = action[code]
            if act == _PUT:
                if not stack:
                    fail("a memo store on an empty stack")
                n = fixed[code]
                if n == 1:
                    key = data[pos]
                elif n:
                    key = int.from_bytes(data[pos : pos + n], "little")
                else:
                    nl = data.find(b"\n", pos)
                    if nl < 0:
                        fail("a text argument without an end of line")
                    key = _memo_index(bytes(data[pos:nl]), fail)
                    n = nl + 1 - pos
                pos += n
                if key > pos:  # the unpickler's memo is an array as long as the largest index
                    fail(f"memo index {key} at byte {pos}: a pickler numbers its objects in order")
                memo[key] = stack[-1]
            elif act == _SCALAR:
                pos += fixed[code]
                append(_ONE)
                total += 1
            elif act == _SCALAR_LEN:
                w = width[code]
                if w == 1:
                    n = data[pos]
                    pos += 1
                else:
                    n = int.from_bytes(data[pos : pos + abs(w)], "little", signed=w < 0)
                    pos += abs(w)
                    if n < 0:
                        fail(f"a negative length ({_NAMES[code]})")
                pos += n
                if pos > end:
                    fail(f"{_NAMES[code]} claims {n} bytes past the end of the data")
                append(_ONE)
                total += 1
            elif act == _GET:
                n = fixed[code]
                if n == 1:
                    key = data[pos]
                elif n:
                    key = int.from_bytes(data[pos : pos + n], "little")
                else:
                    nl = data.find(b"\n", pos)
                    if nl < 0:
                        fail("a text argument without an end of line")
                    key = _memo_index(bytes(data[pos:nl]), fail)
                    n = nl + 1 - pos
                pos += n
                cell = memo.get(key)
                if cell is None:
                    fail("a memo entry read before it is stored")
                append(cell)
                total += cell[0]
                if total > max_nodes:
                    too_big()
            elif act == _MARK:
                marks.append(len(stack))
            elif act == _FROM_MARK or act == _INTO_BELOW_MARK:
                if not marks:
                    fail(f"{_NAMES[code]} without a mark")
                k = marks.pop()
                items = stack[k:]
                del stack[k:]
                if act == _FROM_MARK:
                    for _ in range(lines[code]):
                        nl = data.find(b"\n", pos)
                        if nl < 0:
                            fail("a text argument without an end of line")
                        pos = nl + 1
                    size, depth = collect(items)
                    if depth > max_depth:
                        too_big()
                    append([size, depth])
                    total += size
                    if total > max_nodes:
                        too_big()
                else:
                    if not stack:
                        fail(f"{_NAMES[code]} without a container")
                    grow(stack[-1], items)
            elif act == _INTO:
                k = popped[code]
                if len(stack) < k or (marks and marks[-1] > len(stack) - k):
                    fail(f"{_NAMES[code]} on a stack too short")
                items = stack[-(k - 1) :]
                del stack[-(k - 1) :]
                grow(stack[-1], items)
            elif act == _GENERIC:
                k = popped[code]
                if len(stack) < k or (marks and marks[-1] > len(stack) - k):
                    fail(f"{_NAMES[code]} on a stack too short")
                pos += fixed[code]
                for _ in range(lines[code]):
                    nl = data.find(b"\n", pos)
                    if nl < 0:
                        fail("a text argument without an end of line")
                    pos = nl + 1
                if k:
                    items = stack[-k:]
                    del stack[-k:]
                else:
                    items = ()
                if pushed[code]:
                    size, depth = collect(items)
                    if depth > max_depth:
                        too_big()
                    append([size, depth])
                    total += size
                    if total > max_nodes:
                        too_big()
            elif act == _SCALAR_LINES:
                for _ in range(lines[code]):
                    nl = data.find(b"\n", pos)
                    if nl < 0:
                        fail("a text argument without an end of line")
                    pos = nl + 1
                append(_ONE)
                total += 1
            elif act == _MEMOIZE:
                if not stack:
                    fail("a memo store on an empty stack")
                if len(memo) > pos:
                    fail("more memo entries than bytes")
                memo[len(memo)] = stack[-1]
            elif act == _STOP:
                if pos > end:
                    break
                return pos
            elif act == _NOTHING:
                pos += fixed[code]
            elif act == _POP:
                if marks and marks[-1] == len(stack):
                    marks.pop()
                elif stack:
                    stack.pop()
                else:
                    fail("POP on an empty stack")
            elif act == _POP_MARK:
                if not marks:
                    fail("POP_MARK without a mark")
                del stack[marks.pop() :]
            elif act == _DUP:
                if not stack:
                    fail("DUP on an empty stack")
                append(stack[-1])
                total += stack[-1][0]
                if total > max_nodes:
                    too_big()
            else:
                fail(f"unknown opcode {code:#04x} at byte {pos - 1}")
            if pos > end:
                break
    except IndexError:
        pass
    fail("it ends before its STOP opcode (truncated file?)")
