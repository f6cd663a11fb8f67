# Runs storage-bench --num 2000 on ENGINES (comma-separated) in DIR and checks that it exits 0
# and prints one `bench engine=... workload=...` line for every engine and workload.
# cmake -DBENCH=path -DENGINES=strata,leveldb -DDIR=scratch -P smoke.cmake
execute_process(COMMAND ${BENCH} --num 2000 --engines ${ENGINES} --dir ${DIR}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "storage-bench exited with ${rc}:\n${err}")
endif()
string(REPLACE "," ";" engines "${ENGINES}")
foreach(e ${engines})
  foreach(w fillseq fillrandom readrandom readmissing seekscan)
    if(NOT out MATCHES "bench engine=${e} workload=${w} ops_s=[0-9]+ mb_s=[0-9.]+ p99_us=[0-9.]+ peak_rss_kib=[0-9]+\n")
      message(FATAL_ERROR "no bench line for engine=${e} workload=${w}")
    endif()
  endforeach()
endforeach()
