// Test harness for a compiled Numbas exam (tests/test_numbas.py): waits for the exam to load,
// types window.ATTNTRACE_ANSWERS = [[question index, [matrix of strings per part]], ...] into
// the parts through the runtime (storeAnswer, submit) and writes each part's [score, marks]
// (with window.ATTNTRACE_DEBUG also the answer and the marking messages) into a pre element
// with id attntrace-result, for chromium --dump-dom.
(function () {
  var answers = window.ATTNTRACE_ANSWERS;
  function done(obj) {
    var pre = document.createElement('pre'); pre.id = 'attntrace-result';
    pre.textContent = JSON.stringify(obj); document.body.appendChild(pre);
  }
  function report(p) {
    if (!window.ATTNTRACE_DEBUG) { return [p.score, p.marks]; }
    var messages = window.ATTNTRACE_DEBUG > 1 ? JSON.stringify((p.markingFeedback || []).map(function (f) { return [f.op, String(f.credit), f.reason, f.message]; })) : (p.markingFeedback || []).map(function (f) { return f.message; }).join(" | ");
    return [p.score, p.marks, JSON.stringify(p.studentAnswer), messages, JSON.stringify(p.settings.correctAnswer)];
  }
  var tries = 0;
  function go() {
    tries++;
    var el = document.querySelector('numbas-exam');
    var vm = el && el.viewModel;
    var exam = vm && vm.loaded() && vm.exam().exam;
    if (!(exam && exam.questionList && exam.questionList.length)) {
      if (tries > 400) {
        done({error: 'not loaded', el: !!el, vm: !!vm, loaded: vm ? vm.loaded() : null,
              text: el && el.shadowRoot ? el.shadowRoot.textContent.replace(/\s+/g, ' ').slice(0, 1500) : ''});
        return;
      }
      setTimeout(go, 50); return;
    }
    // Submit one part at a time, in order, each after the one before has finished marking: a
    // later part uses an earlier answer in adaptive marking only once that part is answered.
    var queue = [];
    answers.forEach(function (qa) {
      var q = exam.questionList[qa[0]];
      qa[1].forEach(function (m, i) { queue.push([q.parts[i], m]); });
    });
    function next() {
      try {
        if (!queue.length) {
          done({scores: answers.map(function (qa) { return exam.questionList[qa[0]].parts.map(report); })});
          return;
        }
        var item = queue.shift();
        item[0].storeAnswer(item[1]);
        item[0].submit();
        setTimeout(next, 50);
      } catch (e) { done({error: String(e), stack: String(e.stack)}); }
    }
    next();
  }
  go();
})();
