"""MySQL and MariaDB errors, classified at the boundary by the server's error number.

mysqlclient gives no SQLSTATE on its exceptions, only ``args[0]``: the number. The errors
here are mysqlclient's own classes, wrapped as Django wraps them.
"""

import MySQLdb
import pytest
from django.db import utils

from stalwart.db.errors import (
    is_connection_lost,
    is_lock_wait,
    is_transient,
    is_unique_conflict,
    mysql_errno,
)
from stalwart.db.hints import CREDENTIALS, MISSING_DATABASE, MISSING_TABLES, UNREACHABLE, classify


def wrapped(kind: type, number: int, text: str) -> BaseException:
    """``kind`` (Django's) raised from mysqlclient's exception of the same name."""
    cause = getattr(MySQLdb, kind.__name__)(number, text)
    error = kind(*cause.args)
    error.__cause__ = cause
    return error


@pytest.mark.parametrize(
    ("number", "text"),
    [
        (1213, "Deadlock found when trying to get lock; try restarting transaction"),
        (1205, "Lock wait timeout exceeded; try restarting transaction"),
        (1969, "Query execution was interrupted (max_statement_time exceeded)"),
        (3024, "Query execution was interrupted, maximum statement execution time exceeded"),
        (2006, "Server has gone away"),
        (2013, "Lost connection to server during query"),
    ],
)
def test_deadlocks_lock_waits_timeouts_and_lost_links_are_retried(number, text):
    assert is_transient(wrapped(utils.OperationalError, number, text))


@pytest.mark.parametrize(
    ("kind", "number", "text"),
    [
        (utils.ProgrammingError, 1064, "You have an error in your SQL syntax"),
        (utils.OperationalError, 1049, "Unknown database 'shop'"),
        (utils.OperationalError, 1045, "Access denied for user 'shop'@'localhost'"),
        (utils.DataError, 1406, "Data too long for column 'queue_name' at row 1"),
    ],
)
def test_mistakes_and_refused_data_are_not_retried(kind, number, text):
    assert not is_transient(wrapped(kind, number, text))


def test_only_a_lost_link_counts_as_a_lost_connection():
    assert is_connection_lost(wrapped(utils.OperationalError, 2013, "Lost connection"))
    assert not is_connection_lost(wrapped(utils.OperationalError, 1213, "Deadlock found"))


def test_a_lock_wait_and_a_duplicate_key_are_named():
    assert is_lock_wait(wrapped(utils.OperationalError, 1205, "Lock wait timeout exceeded"))
    assert not is_lock_wait(wrapped(utils.OperationalError, 1213, "Deadlock found"))
    duplicate = wrapped(utils.IntegrityError, 1062, "Duplicate entry 'k' for key 'u'")
    assert is_unique_conflict(duplicate)
    assert mysql_errno(duplicate) == 1062
    assert not is_unique_conflict(wrapped(utils.IntegrityError, 4025, "CONSTRAINT failed"))


def test_other_drivers_have_no_mysql_number():
    assert mysql_errno(utils.OperationalError("database is locked")) is None


@pytest.mark.parametrize(
    ("number", "text", "meaning"),
    [
        (1049, "Unknown database 'shop'", MISSING_DATABASE),
        (1045, "Access denied for user 'shop'@'localhost' (using password: YES)", CREDENTIALS),
        (1146, "Table 'shop.stalwart_job' doesn't exist", MISSING_TABLES),
        (1146, "Table 'shop.orders' doesn't exist", None),
        (2002, "Can't connect to server on '127.0.0.1' (115)", UNREACHABLE),
    ],
)
def test_what_a_mysql_error_means_for_a_person(number, text, meaning):
    assert classify(wrapped(utils.OperationalError, number, text)) == meaning
