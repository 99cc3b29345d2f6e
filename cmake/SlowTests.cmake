# The test cases outside the fast tier (`ctest -L fast`, the unit tests;
# docs/development.md says how long it takes): each took over a second on a
# 2-core machine, because it trains, renders, starts processes or waits on a
# deadline. gtest patterns (SUITE.CASE, * allowed); a pattern naming "Strict"
# is for a strict-device case (troupe_test's STRICT_DEVICE_CASES). Binaries that start the troupe
# binary or a network are SLOW as a whole in their troupe_test call.
# tools/test_report.py (after ctest in tools/test.sh) reads each fast case's
# time in that run and names one over its bound (its FAST_TIER table).
set(TROUPE_SLOW_TESTS
  "FashionClassifierTest.ReachesAtLeast88PercentTestAccuracy"
  "FashionClassifierTest.TrainsAndEvaluatesOnTheStrictDeviceAsOnTheCpu"
  "GanShortRunTest.*"
  "GanReferenceTest.*"
  "GanTrainerTest.*Strict*"
  "D4pgAgentTest.PixelUpdatesOnTheStrictDeviceEndInTheCpusStateBitForBit"
  "D4pgAgentTest.LearnsAContextualBanditFromPixels"
  "D4pgAgentTest.LearnsAContextualBandit"
  "D4pgDeviceFramesTest.AStartedInputMakesTheNextCallsFirstExecutionBetweenCalls"
  "AppoAgentTest.LearnsAContextualBanditFromPixels"
  "*EndToEndTest.*"
  "ExperimentFuzzTest.*"
  "RpcFuzzTest.*"
  "ReportTest.HeadlessChromiumRendersTheTableAndTheCurves"
  "EnvWorkerTest.StepsItsEnvsByteForByteAsThisProcess"
  "EnvWorkerTest.A*PoolInWorkerProcessesEqualsOneInThreads"
  "RecordViewTest.*"
  "CheckpointViewTest.*"
  "GanViewTest.*"
  "ViewerTest.*"
  "EpisodeRecorderTest.Records100StepEpisodeAsMp4ThatDecodesBack"
  "ParameterServiceTest.NoLearnerIsADeadlineNamingTheAddressAndWhy"
  # 1.3-2 s each on a slower 2-core machine (2026-11-29), where the fast
  # tier's 660 cases took 129 s against its 120 s bound:
  "D4pgAgentTest.ADeviceBudgetRefusesTheWholeStateAndTheSplitOneTrainsUnderIt"
  "DeadlineReducerTest.ASlowedReplicaNoLongerSetsThePaceAndAllReplicasStayIdentical"
  "TroupeCheckpointTest.ARestoredTrainerContinuesAsTheUninterruptedOne"
  "D4pgDeviceFramesTest.AStartedInputMakesTheNextCallsFirstBatchBetweenCalls"
  "EnvPoolTest.SyncStepMatchesLoneEnvsWithTheSameSeeds"
  "EnvPoolTest.SyncBatchesOnManyThreadsEqualTheEnvsSteppedInTurn"
  "SyncProcessSchedulerTest.EachProcessRunsItsShareWhileTheCallerRunsItsOwn"
  "ServiceTest.IdleWriterSessionsBeyondTheBoundAreDroppedOldestFirst"
  "ServiceTest.AResumableWriterIsToldWhenTheServerNoLongerHasItsSession"
  "SyncProcessSchedulerTest.ADeadWorkerIsAnErrorAndItsEnvsAreStillCollected"
  "ReplicatorTest.AStalledReplicaTimesOutNamingIt"
  "ActorFleetTest.StopSendsTheWrappersSignalThenSigtermThenSigkill"
  # 0.85-1.25 s each in a CI-like run from a fresh clone (ef1c768), where
  # the fast tier's 654 cases took 114.5 s against its 120 s bound: they
  # start, kill or wait on worker processes and encoders.
  "TroupeCheckpointTest.AKillDuringASaveLeavesACheckpointToResumeFrom"
  "EnvWorkerTest.DestroyingAPoolEndsItsWorkerProcesses"
  "EnvWorkerTest.AnEnvErrorIsReturnedAndTheWorkerKeepsServing"
  "EnvWorkerTest.AnAsyncPoolReportsAKilledWorker"
  "EnvWorkerTest.AKilledWorkerIsAnErrorNamingItNotAHang"
  "EpisodeRecorderTest.SlowEncodingNeverBlocksTheCallerAndDropsTheWholeVideo"
  "EpisodeRecorderTest.KeepsEveryKthStateToStayWithinMaxFps"
  "ActorFleetTest.AnActorThatDiesIsRestartedUpToMaxRestartsAndThenLeft"
  "ActorFleetTest.OnceTheRunStopsADeadActorIsNotRestarted"
  "EnvPoolTest.DestroyingAPoolWithWorkInFlightJoinsCleanly"
  "RunSweepTest.AStoppedSweepEndsWhileRunsWereStillToStart"
  "ServiceTest.CancelEndsABlockedSampleAndEveryLaterOne"
)
