"""Results carry their purpose: a study's transfers are kept, but never enter the routine series,
its counts or its daily summaries (SQLite and PostgreSQL)."""

from __future__ import annotations

from datetime import timedelta

from alembic import command
from sqlalchemy import insert, select

from iepm.results import Purpose
from iepm.store import Archive
from iepm.store.archive import alembic_config, connect_engine
from iepm.store.filters import result_conditions
from iepm.store.schema import daily as DAILY
from iepm.store.schema import results as RESULTS
from iepm.store.schema import studies as STUDIES
from iepm.tuning.store import Study, StudyRecorder
from testkit import sample
from testkit.sample import T0


def daily_runs(archive: Archive) -> int:
    with archive.reading("reading the daily rows") as conn:
        query = select(DAILY.c.n).where(DAILY.c.metric == "runs")
        return sum(conn.execute(query).scalars())


def test_a_study_result_stays_out_of_the_routine_series_and_rollup(archive: Archive) -> None:
    routine = sample.ping(started_at=T0)
    study = sample.ping(started_at=T0 + timedelta(minutes=1), purpose=Purpose.STUDY)
    archive.add(routine)
    archive.add(study)
    assert [r.id for r in archive.results()] == [routine.id]
    assert archive.count() == 1
    assert archive.latest("ping", "cern-1") == routine
    assert daily_runs(archive) == 1  # only the routine run is summarised
    everything = list(archive.results(purpose=None))
    assert [r.id for r in everything] == [routine.id, study.id]
    assert everything[1].purpose is Purpose.STUDY  # the purpose round-trips
    assert [r.id for r in archive.results(purpose="study")] == [study.id]
    total, texts = archive.envelope_page()
    assert total == 1 and '"purpose": "routine"' in texts[0]


def test_add_many_and_reextraction_keep_studies_out_of_the_rollup(archive: Archive) -> None:
    study = sample.ping(started_at=T0, purpose="study")
    archive.add_many([sample.ping(started_at=T0 + timedelta(seconds=1)), study])
    assert daily_runs(archive) == 1
    archive.upsert_by_token(study.model_copy(update={"data": {"rtt_avg_ms": 1.0}}))
    assert daily_runs(archive) == 1  # the day recomputed from routine results only


def test_a_study_recorder_stores_its_runs_as_study_results(archive: Archive) -> None:
    recorder = StudyRecorder(archive, Study("early_stop", "slac-mon", "cern-1", {}))
    run = sample.ping()
    stored_id = recorder.store_result(run)
    assert stored_id == run.id
    assert archive.count() == 0
    assert [r.purpose for r in archive.results(purpose=None)] == [Purpose.STUDY]


def test_the_filter_builder_reads_routine_results_unless_told(archive: Archive) -> None:
    archive.add_many(
        [
            sample.ping("a", T0),
            sample.ping("b", T0 + timedelta(hours=1)),
            sample.ping("a", T0 + timedelta(hours=2), purpose="study"),
        ]
    )

    def targets(**filters: object) -> list[str]:
        query = select(RESULTS.c.target).where(*result_conditions(RESULTS, **filters))  # type: ignore[arg-type]
        with archive.reading("filtering") as conn:
            return sorted(conn.execute(query).scalars())

    assert targets() == ["a", "b"]
    assert targets(purpose=None) == ["a", "a", "b"]
    assert targets(probe=["ping", "iperf3"], since=T0 + timedelta(minutes=30)) == ["b"]
    assert targets(target="a", until=T0 + timedelta(hours=3), purpose="study") == ["a"]
    assert targets(monitor="elsewhere") == []


def test_the_migration_marks_the_runs_studies_name_as_study_results(archive_url: str) -> None:
    with Archive.open(archive_url) as archive:
        routine, studied = sample.ping(started_at=T0), sample.ping(started_at=T0)
        archive.add_many([routine, studied])
    engine = connect_engine(archive_url)
    try:
        config = alembic_config()
        with engine.begin() as conn:
            config.attributes["connection"] = conn
            command.downgrade(config, "0003")  # as an archive written before purposes existed
            conn.execute(
                insert(STUDIES).values(
                    id="s1", kind="sweep", monitor="slac-mon", target="cern-1", started_at=T0,
                    partial=False, params={}, summary={},
                    data={"points": [{"iperf3_result_id": studied.id, "streams": 2}]},
                )
            )  # fmt: skip
    finally:
        engine.dispose()
    with Archive.open(archive_url) as archive:  # upgrades to the head
        assert [r.id for r in archive.results()] == [routine.id]
        assert [r.id for r in archive.results(purpose="study")] == [studied.id]
        assert daily_runs(archive) == 1
