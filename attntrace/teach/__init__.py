"""For teachers: built-in examples, exercises, class grading, LMS export."""
