"""PostgreSQL's statements: where they differ from every database's, concern by concern.

The claim protocol, top to bottom, is ``claims/postgresql.py``; the rest (uniqueness, the
process table but for the pruner's survey, bulk control and retention, counters) is written
as on every database.
"""

from stalwart.db.claims.postgresql import PostgreSQLClaims
from stalwart.db.dialect import PostgreSQLDialect
from stalwart.db.leases import PostgreSQLLeases
from stalwart.db.processes import PostgreSQLProcesses
from stalwart.db.slots import PostgreSQLSlots
from stalwart.db.statements import Statements
from stalwart.db.wakeups import PostgreSQLWakeups


class PostgreSQLStatements(
    PostgreSQLDialect,  # psycopg's parameters, now(), lock_timeout, jit off
    PostgreSQLClaims,  # the claim protocol as single statements
    PostgreSQLWakeups,  # LISTEN/NOTIFY
    PostgreSQLSlots,  # a slot expires by now()
    PostgreSQLProcesses,  # the pruner's survey in one statement
    PostgreSQLLeases,  # a lease taken in one statement
    Statements,
):
    vendor = "postgresql"
