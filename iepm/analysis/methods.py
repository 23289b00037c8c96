"""Names the CLI needs before any analysis runs (kept free of numpy so that ``iepm --help``
starts fast); iepm.analysis.forecast builds one predictor per name (tested)."""

BASELINES = ("ma5", "ewma")
PREDICTORS = ("mean10", "median5", "holt", "levelshift", "levelmode", "levelrel", "lastweek")
METHODS = (*BASELINES, *PREDICTORS, "auto")
START = 5  # first forecast index: MA(5) needs 5 measurements
