"""MySQL's and MariaDB's statements: where they differ from every database's, concern by
concern.

MySQL has no ``UPDATE … RETURNING``, no ``UPDATE`` or ``DELETE`` whose subquery reads the
table it writes, no ``ON CONFLICT`` and no partial index: most concerns write their steps
here as a locking read and a write by id, in one short transaction. The claim protocol, top
to bottom, is ``claims/mysql.py``; wake-ups are polling (no LISTEN/NOTIFY).
"""

from stalwart.db.claims.mysql import MySQLClaims
from stalwart.db.control import MySQLControl
from stalwart.db.counters import MySQLCounters
from stalwart.db.dialect import MySQLDialect
from stalwart.db.leases import MySQLLeases
from stalwart.db.processes import MySQLProcesses
from stalwart.db.slots import MySQLSlots
from stalwart.db.statements import Statements
from stalwart.db.uniqueness import MySQLUniqueness


class MySQLStatements(
    MySQLDialect,  # UTC_TIMESTAMP(6), short transactions, innodb_lock_wait_timeout
    MySQLClaims,  # the claim protocol as short locking transactions
    MySQLUniqueness,  # the unique_holder column stands in for a partial index
    MySQLSlots,  # hand-outs as a locking read, then an update
    MySQLProcesses,  # lock, then delete
    MySQLLeases,  # no ON CONFLICT: a savepoint
    MySQLControl,  # batches as a locking read, then a write by id
    MySQLCounters,  # ON DUPLICATE KEY UPDATE
    Statements,
):
    vendor = "mysql"
