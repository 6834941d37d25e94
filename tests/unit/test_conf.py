import pytest

from stalwart.conf import MIB, read_options
from stalwart.exceptions import ConfigurationError


def read(options):
    return read_options("default", {"OPTIONS": options})


def test_defaults_work_for_a_small_app():
    config = read({})
    assert config.database == "default"
    assert config.heartbeat_interval == 10
    assert config.process_alive_threshold == 60
    assert config.max_arguments_size == MIB
    assert len(config.workers) == 1
    assert config.workers[0].threads == 5
    assert str(config.workers[0].queues) == "*"


def test_behind_a_transaction_pooler_workers_listen_only_on_a_direct_connection():
    plain = read({})
    assert (plain.listen_notify, plain.transaction_pooler, plain.listen_database) == (
        True,
        False,
        None,
    )
    # Nobody could hear a notification through the pooler: none is sent, workers poll.
    assert read({"transaction_pooler": True}).listen_notify is False
    direct = read({"transaction_pooler": True, "listen_database": "direct"})
    assert (direct.listen_notify, direct.listen_database) == (True, "direct")
    assert read({"listen_notify": False, "listen_database": "direct"}).listen_notify is False


def test_task_modules_are_read_in_order():
    assert read({}).task_modules == ()
    config = read({"task_modules": ["reports.jobs", "billing.tasks.nightly"]})
    assert config.task_modules == ("reports.jobs", "billing.tasks.nightly")


def test_worker_entries_are_read_in_order():
    config = read(
        {
            "workers": [
                {"queues": "high,default", "threads": 8, "processes": 2},
                {"queues": ["low"], "threads": 1},
            ]
        }
    )
    assert [str(w.queues) for w in config.workers] == ["high,default", "low"]
    assert [w.threads for w in config.workers] == [8, 1]
    assert config.workers[0].processes == 2


def test_command_line_overrides_replace_only_what_is_given():
    config = read({"workers": [{"queues": "a", "threads": 8}]})
    worker = config.worker(threads=2, queues=None)
    assert worker.threads == 2
    assert str(worker.queues) == "a"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"threads": 3}, "TASKS['default']['OPTIONS']['threads'] is not a Stalwart setting"),
        (
            {"workers": [{"threads": 0}]},
            "TASKS['default']['OPTIONS']['workers'][0]['threads'] must be a whole number from 1",
        ),
        ({"workers": [{"threads": "4"}]}, "['workers'][0]['threads'] must be a whole number"),
        ({"workers": [{"queues": "bad name"}]}, "['workers'][0]['queues'] is invalid"),
        ({"workers": [{"colour": "red"}]}, "['workers'][0]['colour'] is not a Stalwart setting"),
        ({"workers": []}, "['workers'] must be a non-empty list of dicts"),
        ({"workers": ["x"]}, "['workers'][0] must be a dict"),
        ({"heartbeat_interval": -1}, "['heartbeat_interval'] must be between"),
        (
            {"heartbeat_interval": 10, "process_alive_threshold": 25},
            "['process_alive_threshold'] (25 s) is too short for heartbeat_interval 10 s",
        ),
        (
            # A heartbeat that takes 1.5 s, and one failed, and the kernel would end it.
            {"heartbeat_interval": 2, "process_alive_threshold": 6, "statement_timeout": 1.5},
            (
                "Safe values: process_alive_threshold 6.5 s or more; or statement_timeout 1 s "
                "or less; or heartbeat_interval 1.8 s or less."
            ),
        ),
        ({"max_arguments_size": True}, "['max_arguments_size'] must be a whole number"),
        ({"listen_notify": "yes"}, "['listen_notify'] must be True or False"),
        ({"transaction_pooler": 1}, "['transaction_pooler'] must be True or False"),
        ({"listen_database": ""}, "['listen_database'] must be a database alias or None"),
        ({"database": ""}, "['database'] must be a database alias"),
        ({"task_modules": "reports.jobs"}, "['task_modules'] must be a list of dotted module"),
        ({"task_modules": ["reports.jobs", 3]}, "['task_modules'][1] must be a dotted module"),
        ({"task_modules": ["reports/jobs.py"]}, "['task_modules'][0] must be a dotted module"),
        ({"task_modules": ["reports..jobs"]}, "['task_modules'][0] must be a dotted module"),
    ],
)
def test_invalid_options_name_the_setting(options, message):
    with pytest.raises(ConfigurationError) as caught:
        read(options)
    assert message in str(caught.value)
