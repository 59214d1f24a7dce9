"""Fleet allocation: many jobs on a heterogeneous fleet, each job's plan and hardware chosen together by CP-SAT."""
