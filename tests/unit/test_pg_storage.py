"""The HPO study storage on a real PostgreSQL (hpo.storage=postgresql://…): a smoke test.

Proves the private test server (tests/pg-server) and the driver work through Optuna's
RDBStorage, in a database of this test's own (the `postgres_db` fixture): a study written
through one storage object is read back, trials and best value, through a second one, as a
second process would see it.
"""

from __future__ import annotations

import optuna
import pytest

pytestmark = pytest.mark.postgres


def test_a_study_in_postgresql_is_seen_through_a_second_storage(postgres_db: str) -> None:
    writer = optuna.storages.RDBStorage(postgres_db)
    reader = optuna.storages.RDBStorage(postgres_db)
    try:
        assert writer.engine.dialect.name == "postgresql"
        study = optuna.create_study(
            study_name="smoke", storage=writer, direction="minimize", sampler=optuna.samplers.RandomSampler(seed=0)
        )
        study.optimize(lambda trial: (trial.suggest_float("x", -2.0, 2.0) - 0.5) ** 2, n_trials=5)

        seen = optuna.load_study(study_name="smoke", storage=reader)
        assert [t.number for t in seen.trials] == [0, 1, 2, 3, 4]
        assert all(t.state == optuna.trial.TrialState.COMPLETE for t in seen.trials)
        assert [t.params for t in seen.trials] == [t.params for t in study.trials]
        assert [t.value for t in seen.trials] == [t.value for t in study.trials]
        assert seen.best_value == study.best_value == min(t.value for t in study.trials if t.value is not None)
        assert seen.best_trial.number == study.best_trial.number
        assert seen.direction == optuna.study.StudyDirection.MINIMIZE
    finally:
        writer.engine.dispose()
        reader.engine.dispose()
