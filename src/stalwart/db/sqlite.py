"""SQLite's statements: where they differ from every database's, concern by concern.

One writer at a time, on one host: the host's clock, and the write lock taken before
anything is read. The claim protocol, top to bottom, is ``claims/sqlite.py``; wake-ups are
polling; the rest is written as on every database.
"""

from stalwart.db.claims.sqlite import SQLiteClaims
from stalwart.db.dialect import SQLiteDialect
from stalwart.db.leases import SQLiteLeases
from stalwart.db.slots import SQLiteSlots
from stalwart.db.statements import Statements


class SQLiteStatements(
    SQLiteDialect,  # the host's clock, the write lock up front
    SQLiteClaims,  # the claim protocol, one job per statement where it must be
    SQLiteSlots,  # a slot expires in Julian days
    SQLiteLeases,  # the upsert is the compare-and-set
    Statements,
):
    vendor = "sqlite"
